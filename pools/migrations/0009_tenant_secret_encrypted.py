"""Tenant secrets are encrypted at rest (pools/encryption.py): every clear value is sealed
under the current key of ENCRYPTION_KEYS, then the clear column is dropped. A database holding
secrets and no key ring configured stops here with the key ring's error (nothing is lost: the
migration runs in one transaction). Reversible: back, the values are decrypted again."""

from django.db import migrations, models

from pools import encryption
from pools.models import secret_context


def seal(apps, schema_editor):
    TenantSecret = apps.get_model("pools", "TenantSecret")
    for secret in TenantSecret.objects.all():
        context = secret_context(secret.tenant_id, secret.name)
        secret.key_id, secret.ciphertext = encryption.encrypt(secret.value, context=context)
        secret.save(update_fields=["key_id", "ciphertext"])


def unseal(apps, schema_editor):
    TenantSecret = apps.get_model("pools", "TenantSecret")
    for secret in TenantSecret.objects.all():
        context = secret_context(secret.tenant_id, secret.name)
        secret.value = encryption.decrypt(secret.key_id, secret.ciphertext, context=context)
        secret.save(update_fields=["value"])


class Migration(migrations.Migration):
    dependencies = [("pools", "0008_memory_coupled_default")]

    operations = [
        migrations.AddField(
            model_name="tenantsecret",
            name="ciphertext",
            field=models.BinaryField(default=b""),
            preserve_default=False,
        ),
        migrations.AddField(
            model_name="tenantsecret",
            name="key_id",
            field=models.CharField(
                default="", help_text="The ENCRYPTION_KEYS entry it is sealed under", max_length=32
            ),
            preserve_default=False,
        ),
        migrations.AlterField(
            model_name="tenantsecret",
            name="value",
            field=models.TextField(default=""),
        ),
        migrations.RunPython(seal, unseal),
        migrations.RemoveField(model_name="tenantsecret", name="value"),
    ]
