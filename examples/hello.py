# A program as a model would write it: print something, and let the last expression be the result.
import platform

print(f"hello from Python {platform.python_version()} inside the sandbox")
{"answer": 6 * 7}
