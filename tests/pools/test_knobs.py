"""Policy knobs: declared once (pools/knobs.py), documented in one table, read through one cache
that a publish empties when it commits."""

import json
import logging
from itertools import takewhile
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError

from config.builders import SYSTEM
from pools import knobs
from pools.knobs import DEFAULTS, KNOBS, PoolKnobs, knobs_for, pool_policy
from pools.models import ComputePool, SchedulingPolicyVersion
from pools.services import policy_version_publish

DOC = Path(__file__).resolve().parents[2] / "docs" / "scheduler.md"
MARK = "<!-- tests/pools/test_knobs.py holds this table equal to pools.knobs.KNOBS -->"


def shown(value) -> str:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return json.dumps(value)


def knob_table() -> list[str]:
    return ["| knob | default | meaning |", "| --- | --- | --- |"] + [
        f"| `{k.name}` | `{shown(k.default)}` | {k.doc} |" for k in KNOBS.values()
    ]


def test_the_docs_table_is_the_knob_table():
    lines = DOC.read_text().split(MARK, 1)[1].lstrip("\n").split("\n")
    table = list(takewhile(lambda line: line.startswith("|"), lines))
    expected = knob_table()
    assert table == expected, "docs/scheduler.md 'Policy knobs' should read:\n" + "\n".join(
        expected
    )


def test_every_knob_is_a_field_whose_default_passes_its_own_check():
    assert list(KNOBS) == list(PoolKnobs.__dataclass_fields__)
    for knob in KNOBS.values():
        assert knob.check(knob.default) is None, knob.name
        assert getattr(DEFAULTS, knob.name) == knob.default and knob.doc


def test_a_pool_that_names_no_knob_has_every_default(pool):
    assert knobs_for(pool) == DEFAULTS == knobs_for(pool.pk)
    assert knobs_for(ComputePool()) == DEFAULTS  # unsaved: no version to read


def test_a_pool_without_a_version_has_every_default(pool):
    SchedulingPolicyVersion.objects.filter(policy__pool=pool).delete()
    assert knobs_for(pool) == DEFAULTS


def publish(pool, **values):
    current = pool.scheduling_policy.current
    return policy_version_publish(
        policy=current.policy, weights=current.weights, knobs=values, actor=SYSTEM
    )


def test_a_read_is_cached_and_a_publish_is_read_at_once(pool, django_assert_num_queries):
    with django_assert_num_queries(1):
        assert knobs_for(pool).stop_grace_s == 10
    with django_assert_num_queries(0):  # the knobs and the core policy of the same version
        knobs_for(pool)
        assert pool_policy(pool).version == 1
    publish(pool, stop_grace_s=30)
    # inside the publishing transaction the new version is read (and kept by no one)
    assert knobs_for(pool).stop_grace_s == 30
    assert pool_policy(pool).version == 2


def test_a_committed_publish_empties_the_pools_cached_version(
    pool, django_assert_num_queries, django_capture_on_commit_callbacks
):
    knobs_for(pool)
    with django_capture_on_commit_callbacks(execute=True):
        publish(pool, output_limit_mib=300)
    with django_assert_num_queries(1):
        assert knobs_for(pool).output_limit_mib == 300
    with django_assert_num_queries(0):  # cached again once committed
        assert knobs_for(pool).output_limit_mib == 300


def test_a_stored_value_its_check_refuses_gives_the_default(pool, caplog):
    # written around the publish service, which refuses it (an older version's value)
    current = pool.scheduling_policy.current
    SchedulingPolicyVersion.objects.create(
        policy=current.policy,
        number=current.number + 1,
        weights=current.weights,
        knobs={"preemption_min_runtime_s": -1, "stop_grace_s": 20, "gone": 1},
    )
    with caplog.at_level(logging.WARNING, logger=knobs.__name__):
        read = knobs_for(pool)
    assert read.preemption_min_runtime_s == DEFAULTS.preemption_min_runtime_s
    assert read.stop_grace_s == 20
    assert "preemption_min_runtime_s must be between 0 and 86400 s" in caplog.text


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"stop_grace_s": 0}, "'stop_grace_s' must be between 1 and 86400 s."),
        ({"output_limit_mib": "a"}, "'output_limit_mib' must be an integer number of MiB."),
        ({"short_job_share": 1}, "'short_job_share' must be a number in [0, 1)."),
    ],
)
def test_publishing_checks_each_knob_with_its_declaration(pool, values, message):
    with pytest.raises(ValidationError) as refused:
        publish(pool, **values)
    assert refused.value.message_dict["knobs"] == [message]
