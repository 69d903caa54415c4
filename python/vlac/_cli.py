"""The `vlac` program of a pip install: `vlac serve ...` runs the Python server in this
interpreter; every other subcommand runs the C++ program installed beside this file."""
import os
import sys
from pathlib import Path


def main() -> int:
    argv = sys.argv[1:]
    if argv and argv[0] == "serve":
        from .serve import main as serve_main

        return serve_main(argv[1:])
    exe = Path(__file__).resolve().parent / "bin" / "vlac"
    if not exe.is_file():
        sys.stderr.write(f"vlac: error: the vlac program is missing from this install ({exe})\n")
        return 1
    os.execv(str(exe), [str(exe)] + argv)
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main())
