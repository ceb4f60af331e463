"""Who may see which rows: one rule, declared per model, applied by one queryset.

A model says where its rows lead (`visibility = Visibility(tenant="tenant", node="node")`) and
uses `VisibleQuerySet`; `Model.objects.visible_to(actor)` then answers, for every model alike:

- the system sees every row;
- a node's agent sees the rows that lead to its own node (`node`), nothing else;
- a person sees their own rows only where the model has an `owner` (API tokens), every row of
  a `public` model (pools, shapes, priority classes), every row as an operator, and otherwise
  the rows of their own tenants (`tenant`);
- nobody else sees anything.

Rows out of sight answer 404, never 403, so another tenant's objects do not even leak their
existence.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.core.exceptions import FieldDoesNotExist
from django.db import models

from .actors import Actor


@dataclass(frozen=True)
class Visibility:
    """Lookup paths from a model's rows: to their tenant ("pk" for Tenant itself), to the node
    whose agent may see them, to the person who alone sees them; or public to every person.
    All empty: operators (and the system) only."""

    tenant: str = ""
    node: str = ""
    owner: str = ""
    public: bool = False
    # platform roles that see every row besides operators (policy admins: tenants and quotas)
    seen_by: tuple[str, ...] = ()


class VisibleQuerySet(models.QuerySet):
    def visible_to(self, actor: Actor):
        rule: Visibility = self.model.visibility
        if actor.is_system:
            return self
        if actor.is_node:
            return self._leading_to(rule.node, actor.node.pk)
        if not actor.is_person:
            return self.none()
        if rule.owner:
            return self._leading_to(rule.owner, actor.user.pk)
        if rule.public or actor.is_operator or (rule.seen_by and actor.has_role(*rule.seen_by)):
            return self
        if not rule.tenant:
            return self.none()
        return self._leading_to(f"{rule.tenant}__in", actor.tenant_ids)

    def _leading_to(self, lookup: str, value):
        if not lookup:
            return self.none()
        if _crosses_to_many(self.model, lookup):
            # e.g. a job with two leases on the node: each row still comes back once
            return self.filter(
                pk__in=self.model._base_manager.filter(**{lookup: value}).values("pk")
            )
        return self.filter(**{lookup: value})


def _crosses_to_many(model, lookup: str) -> bool:
    for name in lookup.split("__"):
        if name == "pk":
            return False
        try:
            field = model._meta.get_field(name)
        except FieldDoesNotExist:  # a lookup such as "in", not a field
            return False
        if field.one_to_many or field.many_to_many:
            return True
        if not field.is_relation:
            return False
        model = field.related_model
    return False
