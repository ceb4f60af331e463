"""Tenants, roles, pools and the policy objects a policy admin edits in the Django admin, one
module per what they are for; every model is importable from `pools.models`."""

from .access import (
    ApiToken,
    SupportGrant,
    SupportGrantEvent,
    TenantSecret,
    new_token_secret,
    secret_context,
    token_digest,
)
from .catalogue import REQUEST_FIELDS, PriorityClass, PriorityClassQuerySet, ResourceShape
from .policy import AllowedRegistry, PoolTrustedKey, SchedulingPolicy, SchedulingPolicyVersion
from .quota import CreditAccount, CreditCharge, Quota
from .storage import ServerSideEncryption, TenantBucket, TenantBucketEvent
from .tenancy import ComputePool, Membership, MembershipEvent, Tenant

__all__ = [
    "REQUEST_FIELDS",
    "AllowedRegistry",
    "ApiToken",
    "ComputePool",
    "CreditAccount",
    "CreditCharge",
    "Membership",
    "MembershipEvent",
    "PoolTrustedKey",
    "PriorityClass",
    "PriorityClassQuerySet",
    "Quota",
    "ResourceShape",
    "SchedulingPolicy",
    "SchedulingPolicyVersion",
    "ServerSideEncryption",
    "SupportGrant",
    "SupportGrantEvent",
    "Tenant",
    "TenantBucket",
    "TenantBucketEvent",
    "TenantSecret",
    "new_token_secret",
    "secret_context",
    "token_digest",
]
