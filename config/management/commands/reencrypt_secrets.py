"""Key rotation, step two (pools/encryption.py): re-encrypt every value kept encrypted at rest
under the current key, the first of ENCRYPTION_KEYS: the tenants' secrets, their buckets'
credentials and the tenants' data keys of outputs at rest (jobs/encryption_at_rest.py: the data
keys are re-wrapped, the output files are not rewritten). Afterwards the older keys can be
dropped. One command for all of them; the name is the one it always had."""

from django.core.management.base import BaseCommand

from jobs.encryption_at_rest import data_keys_rewrap
from pools import encryption
from pools.services import tenant_buckets_reencrypt, tenant_secrets_reencrypt


class Command(BaseCommand):
    help = (
        "Re-encrypt every value kept encrypted at rest (secrets, bucket credentials, the outputs'"
        " data keys) under the current key (the first of ENCRYPTION_KEYS)."
    )

    def handle(self, *args, **options):
        current = encryption.current_key_id()
        done = tenant_secrets_reencrypt()
        self.stdout.write(f"{done} tenant secrets re-encrypted under key {current!r}.")
        done = tenant_buckets_reencrypt()
        self.stdout.write(f"{done} bucket credentials re-encrypted under key {current!r}.")
        done = data_keys_rewrap()
        self.stdout.write(f"{done} data keys re-wrapped under key {current!r}.")
