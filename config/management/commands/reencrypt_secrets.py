"""Key rotation, step two (pools/encryption.py): re-encrypt every value kept encrypted at rest
under the current key, the first of ENCRYPTION_KEYS. Afterwards the older keys can be dropped."""

from django.core.management.base import BaseCommand

from pools import encryption
from pools.services import tenant_secrets_reencrypt


class Command(BaseCommand):
    help = "Re-encrypt every stored secret under the current key (the first of ENCRYPTION_KEYS)."

    def handle(self, *args, **options):
        current = encryption.current_key_id()
        done = tenant_secrets_reencrypt()
        self.stdout.write(f"{done} tenant secrets re-encrypted under key {current!r}.")
