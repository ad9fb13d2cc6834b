"""One execution: its terms, the conversation with its child, the driver, the outcome and the
pool of prepared children. Internal."""
