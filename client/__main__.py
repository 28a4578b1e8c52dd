"""``python -m client`` runs the ``tandem`` CLI (used to spawn cluster processes)."""

from client.cli import main

main()
