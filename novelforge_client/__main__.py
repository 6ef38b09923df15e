"""``python -m novelforge_client`` is the ``novelforge`` command."""
from novelforge_client.cli import main

main()
