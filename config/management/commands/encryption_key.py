"""A new entry for ENCRYPTION_KEYS (pools/encryption.py), or, with --init-file, the key ring
`make run` uses when none is configured: written once to ENCRYPTION_KEYS_FILE, mode 0600."""

import os
from datetime import UTC, datetime

from django.conf import settings
from django.core.management.base import BaseCommand

from pools import encryption


class Command(BaseCommand):
    help = "Print a new ENCRYPTION_KEYS entry (id=key); --init-file writes a ring when none is set."

    def add_arguments(self, parser):
        parser.add_argument(
            "--init-file",
            action="store_true",
            help="when no key ring is configured, write one to ENCRYPTION_KEYS_FILE (mode 0600)",
        )

    def handle(self, *args, init_file=False, **options):
        entry = f"{datetime.now(UTC):%Y%m%d%H%M%S}={encryption.new_key()}"
        if not init_file:
            self.stdout.write(entry)
            return
        if settings.ENCRYPTION_KEYS:
            return  # configured (the variable, or the file written before): nothing to do
        path = settings.ENCRYPTION_KEYS_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_EXCL: never overwrite a ring (its key decrypts what is stored)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(entry + "\n")
        self.stdout.write(f"A new key ring was written to {path} (mode 0600).")
