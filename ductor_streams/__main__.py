"""``python -m ductor_streams``: the ``ductor-streams`` command."""

from ductor_streams.process.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
