"""Issue #17: logs and outputs have their own token scopes, and shapes their own admin role.

A token that could read before keeps reading logs and outputs (`read` gains `logs:read` and
`outputs:read`); the policy admins' group loses the shape permissions (shape admins' now)."""

from django.db import migrations

SPLIT_FROM_READ = ("logs:read", "outputs:read")


def _read_tokens(apps):
    # Filtered in Python: SQLite (make run's default) has no JSON `contains` lookup.
    ApiToken = apps.get_model("pools", "ApiToken")
    return (token for token in ApiToken.objects.iterator() if "read" in (token.scopes or []))


def split_read_scope(apps, schema_editor):
    for token in _read_tokens(apps):
        scopes = sorted(set(token.scopes) | set(SPLIT_FROM_READ))
        if scopes != token.scopes:
            token.scopes = scopes
            token.save(update_fields=["scopes"])


def unsplit_read_scope(apps, schema_editor):
    for token in _read_tokens(apps):
        token.scopes = [s for s in token.scopes if s not in SPLIT_FROM_READ]
        token.save(update_fields=["scopes"])


def shapes_leave_policy_admins(apps, schema_editor):
    Group = apps.get_model("auth", "Group")
    for group in Group.objects.filter(name="policy_admin"):
        shapes = group.permissions.filter(
            content_type__app_label="pools", content_type__model="resourceshape"
        )
        group.permissions.remove(*shapes)


class Migration(migrations.Migration):
    dependencies = [
        ("pools", "0010_support_grants"),
        ("auth", "0012_alter_user_first_name_max_length"),
    ]

    operations = [
        migrations.RunPython(split_read_scope, unsplit_read_scope),
        migrations.RunPython(shapes_leave_policy_admins, migrations.RunPython.noop),
    ]
