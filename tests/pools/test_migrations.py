"""Data migrations of pools: corrected policy versions for the legacy scorer name (0003),
today's default for pools still on the previous one (0008), tenant secrets encrypted (0009)."""

import importlib

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.test import override_settings

from placement import DEFAULT_POLICY
from pools import encryption
from pools.models import secret_context

fix = importlib.import_module("pools.migrations.0003_publish_corrected_policy_versions")
default = importlib.import_module("pools.migrations.0008_memory_coupled_default")
locality = importlib.import_module("pools.migrations.0018_data_locality_default")
BEFORE = [("pools", "0002_priority_class_restrictions")]
AFTER = [("pools", "0003_publish_corrected_policy_versions")]


def test_the_migrations_copy_the_defaults_of_their_day():
    assert default.PREVIOUS_DEFAULT == fix.PRODUCT_DEFAULT
    assert locality.PREVIOUS_DEFAULT == default.NEW_DEFAULT
    assert DEFAULT_POLICY.weights == locality.NEW_DEFAULT  # the newest: today's default


@pytest.mark.parametrize(
    ("weights", "published"),
    [
        (fix.LEGACY_DEFAULT, fix.PRODUCT_DEFAULT),
        ({}, fix.PRODUCT_DEFAULT),
        ({"binpack": 2, "fragmentation": 1}, {"bin_pack": 2, "fragmentation": 1}),
        ({"binpack": 2, "bin_pack": 3}, {"bin_pack": 3}),
        ({"bin_pack": 1}, None),
    ],
)
def test_what_each_current_version_is_corrected_to(weights, published):
    assert fix.corrected(weights) == published


@pytest.fixture
def back_to_latest():
    """Later migrations (pools 0004 …) are unapplied by going back to BEFORE: apply them again
    so the tests after this one find today's schema."""
    yield
    executor = MigrationExecutor(connection)
    executor.migrate(executor.loader.graph.leaf_nodes())


@pytest.mark.django_db(transaction=True)
def test_pools_on_a_legacy_version_get_a_corrected_one(back_to_latest):
    executor = MigrationExecutor(connection)
    executor.migrate(BEFORE)
    apps = executor.loader.project_state(BEFORE).apps
    ComputePool = apps.get_model("pools", "ComputePool")
    SchedulingPolicy = apps.get_model("pools", "SchedulingPolicy")
    policies = {}
    for slug, versions in {
        "legacy": [fix.LEGACY_DEFAULT],
        "edited": [fix.LEGACY_DEFAULT, {"binpack": 2, "locality": 1}],
        "fine": [fix.LEGACY_DEFAULT, {"bin_pack": 1}],
    }.items():
        policy = SchedulingPolicy.objects.create(
            pool=ComputePool.objects.create(name=slug, slug=slug)
        )
        for number, weights in enumerate(versions, 1):
            policy.versions.create(number=number, weights=weights, knobs={"k": number})
        policies[slug] = policy.pk

    executor = MigrationExecutor(connection)
    executor.migrate(AFTER)
    apps = executor.loader.project_state(AFTER).apps
    Version = apps.get_model("pools", "SchedulingPolicyVersion")

    def newest(slug):
        version = Version.objects.filter(policy_id=policies[slug]).order_by("-number").first()
        return version.number, version.weights, version.knobs

    assert newest("legacy") == (2, fix.PRODUCT_DEFAULT, {"k": 1})
    assert newest("edited") == (3, {"bin_pack": 2, "locality": 1}, {"k": 2})
    assert newest("fine") == (2, {"bin_pack": 1}, {"k": 2})
    assert Version.objects.filter(policy_id=policies["legacy"], number=1).get().weights == (
        fix.LEGACY_DEFAULT
    )


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("migration", "before", "after"),
    [
        (default, "0007_quota_dimensions_credits", "0008_memory_coupled_default"),
        (locality, "0017_tenant_buckets", "0018_data_locality_default"),
    ],
)
def test_pools_on_the_previous_default_get_todays(back_to_latest, migration, before, after):
    default = migration
    before, after = [("pools", before)], [("pools", after)]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    apps = executor.loader.project_state(before).apps
    ComputePool = apps.get_model("pools", "ComputePool")
    SchedulingPolicy = apps.get_model("pools", "SchedulingPolicy")
    edited = dict(default.PREVIOUS_DEFAULT, node_in_use=5.0)
    policies = {}
    for slug, weights in {"on-default": default.PREVIOUS_DEFAULT, "edited": edited}.items():
        policy = SchedulingPolicy.objects.create(
            pool=ComputePool.objects.create(name=slug, slug=slug)
        )
        policy.versions.create(number=1, weights=weights, knobs={"k": 1})
        policies[slug] = policy.pk

    executor = MigrationExecutor(connection)
    executor.migrate(after)
    Version = executor.loader.project_state(after).apps.get_model(
        "pools", "SchedulingPolicyVersion"
    )

    def newest(slug):
        version = Version.objects.filter(policy_id=policies[slug]).order_by("-number").first()
        return version.number, version.weights, version.knobs

    assert newest("on-default") == (2, default.NEW_DEFAULT, {"k": 1})
    assert newest("edited") == (1, edited, {"k": 1})


SECRETS_BEFORE = [("pools", "0008_memory_coupled_default")]
SECRETS_AFTER = [("pools", "0009_tenant_secret_encrypted")]


def _clear_secret(executor, value="clear-value-42"):
    apps = executor.loader.project_state(SECRETS_BEFORE).apps
    tenant = apps.get_model("pools", "Tenant").objects.create(name="enc", slug="enc")
    apps.get_model("pools", "TenantSecret").objects.create(
        tenant=tenant, name="db-pass", value=value
    )
    return tenant.pk


@pytest.mark.django_db(transaction=True)
def test_the_clear_secrets_stored_before_are_encrypted_and_decrypted_back(back_to_latest):
    executor = MigrationExecutor(connection)
    executor.migrate(SECRETS_BEFORE)
    tenant_id = _clear_secret(executor)

    executor = MigrationExecutor(connection)
    executor.migrate(SECRETS_AFTER)
    apps = executor.loader.project_state(SECRETS_AFTER).apps
    row = apps.get_model("pools", "TenantSecret").objects.get()
    assert row.key_id == "test-1" and b"clear-value-42" not in bytes(row.ciphertext)
    context = secret_context(tenant_id, "db-pass")
    assert encryption.decrypt(row.key_id, row.ciphertext, context=context) == "clear-value-42"

    executor = MigrationExecutor(connection)
    executor.migrate(SECRETS_BEFORE)  # reversible: the clear value comes back
    apps = executor.loader.project_state(SECRETS_BEFORE).apps
    assert apps.get_model("pools", "TenantSecret").objects.get().value == "clear-value-42"


@pytest.mark.django_db(transaction=True)
def test_without_a_key_ring_the_migration_stops_and_keeps_the_clear_values(back_to_latest):
    executor = MigrationExecutor(connection)
    executor.migrate(SECRETS_BEFORE)
    _clear_secret(executor)
    executor = MigrationExecutor(connection)
    with override_settings(ENCRYPTION_KEYS={}), pytest.raises(encryption.EncryptionError):
        executor.migrate(SECRETS_AFTER)
    executor = MigrationExecutor(connection)
    assert ("pools", "0009_tenant_secret_encrypted") not in executor.loader.applied_migrations
    apps = executor.loader.project_state(SECRETS_BEFORE).apps
    assert apps.get_model("pools", "TenantSecret").objects.get().value == "clear-value-42"
