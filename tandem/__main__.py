"""``python -m tandem`` runs the ``tandem`` CLI (the launcher spawns cluster processes so)."""

from tandem.cli import main

main()
