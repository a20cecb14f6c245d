"""``python -m daskstream``: the same as the ``daskstream`` command."""

from daskstream.cli import main

if __name__ == "__main__":
    main()
