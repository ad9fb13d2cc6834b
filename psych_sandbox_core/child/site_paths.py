"""What the site module does at start-up, done for an interpreter started with ``-S``, less the
code nobody asked for."""

# Uses names the other modules define: they run as one namespace (loader.py).

import os

# The site module (and the builtins module it imports) at load, like resource (see
# resource_limits.py): importing it runs nothing under -S, and its work is done later, in the
# program's process, as the program's identity (_as_site_would); loaded before the bootstrap
# forks, that work costs a fresh fork about 0.8 ms less, measured.
import site
import sys


def _as_site_would():
    """What the site module does at start-up, for an interpreter the host started without it
    (``-S``), less the code nobody asked for: the directories it adds to the path (the
    site-packages, a virtual environment's and its prefixes, the directories ``.pth`` files
    name), the builtins it installs (exit, quit, help, copyright, credits, license). Left out:
    the ``import`` lines of ``.pth`` files and sitecustomize, code a start would otherwise run
    in every child (a hook, a certificate injector), costing milliseconds before any program;
    and the user's site directory, which isolated mode never adds, is not looked up (site
    asks the password database for it, about a millisecond). An interpreter whose site module
    is not as expected runs it whole."""
    if not sys.flags.no_site:
        return  # started with site (a backend that starts the bootstrap its own way)
    kept = {
        name: getattr(site, name)
        for name in ("addpackage", "addusersitepackages", "execsitecustomize", "execusercustomize")
    }
    try:
        site.addpackage = _pth_paths_only
        site.execsitecustomize = site.execusercustomize = _nothing
        if sys.flags.no_user_site:
            site.ENABLE_USER_SITE = False
            site.addusersitepackages = _no_user_site
        site.main()
    except Exception:
        for name, value in kept.items():
            setattr(site, name, value)
        site.main()
    finally:
        for name, value in kept.items():
            setattr(site, name, value)


def _nothing():
    pass


def _no_user_site(known_paths):
    return known_paths


def _pth_paths_only(sitedir, name, known_paths):
    """site.addpackage without its code lines: the directories a ``.pth`` file names that
    exist are added to the path, the lines that start with ``import`` are not run."""
    reset = known_paths is None
    if reset:
        known_paths = site._init_pathinfo()  # type: ignore[attr-defined]
    try:
        with open(os.path.join(sitedir, name), encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError):
        return None if reset else known_paths
    for line in lines:
        if not line.strip() or line.startswith(("#", "import ", "import\t")):
            continue
        directory, case = site.makepath(sitedir, line.rstrip())
        if case not in known_paths and os.path.exists(directory):
            sys.path.append(directory)
            known_paths.add(case)
    return None if reset else known_paths
