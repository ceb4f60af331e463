import re

import pytest

POLICY_PAGES = [
    "/admin/",
    "/admin/pools/quota/",
    "/admin/pools/priorityclass/",
    "/admin/pools/allowedregistry/",
    "/admin/pools/schedulingpolicy/",
    "/admin/pools/schedulingpolicyversion/add/",
]

# Shapes are the shape admins' (#17); the policy admins' pages and theirs do not overlap.
SHAPE_PAGES = ["/admin/pools/resourceshape/", "/admin/pools/resourceshape/add/"]


@pytest.mark.parametrize("url", POLICY_PAGES)
def test_policy_admin_pages_load_for_policy_admin(client, policy_admin, url):
    client.force_login(policy_admin)
    assert client.get(url).status_code == 200


@pytest.mark.parametrize("url", ["/admin/", *SHAPE_PAGES])
def test_shape_pages_load_for_a_shape_admin(client, shape_admin, url):
    client.force_login(shape_admin)
    assert client.get(url).status_code == 200


@pytest.mark.parametrize("url", [*POLICY_PAGES, *SHAPE_PAGES])
def test_policy_admin_pages_refuse_a_tenant_member(client, member, url):
    client.force_login(member)
    response = client.get(url)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_editing_a_policy_publishes_a_new_version_after_its_review(client, policy_admin, pool):
    client.force_login(policy_admin)
    policy = pool.scheduling_policy
    url = f"/admin/pools/schedulingpolicyversion/add/?policy={policy.pk}"
    body = {"policy": policy.pk, "weights": '{"bin_pack": 2}', "knobs": "{}", "comment": "pack"}
    review = client.post(url, body)
    assert review.status_code == 200  # the differences first, nothing published yet
    html = review.content.decode()
    assert 'id="policy-diff"' in html and 'data-diff="bin_pack"' in html
    assert 'data-diff="memory_fgd"' in html and "removed" in html
    assert policy.versions.count() == 1
    reviewed = re.search(r'name="reviewed" value="([0-9a-f]{64})"', html).group(1)
    # changed after the review: reviewed again
    again = client.post(url, {**body, "weights": '{"bin_pack": 3}', "reviewed": reviewed})
    assert again.status_code == 200 and policy.versions.count() == 1
    response = client.post(url, {**body, "reviewed": reviewed})
    assert response.status_code == 302
    numbers = list(policy.versions.order_by("number").values_list("number", "weights"))
    assert numbers == [(1, numbers[0][1]), (2, {"bin_pack": 2})]


def test_a_new_version_starts_from_a_copy_of_the_current_one(client, policy_admin, pool):
    client.force_login(policy_admin)
    policy = pool.scheduling_policy
    chooser = client.get("/admin/pools/schedulingpolicyversion/add/").content.decode()
    assert f'href="?policy={policy.pk}"' in chooser
    html = client.get(f"/admin/pools/schedulingpolicyversion/add/?policy={policy.pk}")
    html = html.content.decode()
    # the weights in their own units, not raw JSON at 1e9: a copy to edit, line by line, and
    # the current version's table (10⁹, rank, what each scorer scores)
    assert "affinity = 1e9" in html and "memory_fgd = 1e6" in html
    assert "1000000000" not in html.split('id="policy-current"')[0]
    current = html.split('id="policy-current"')[1]
    assert "10⁹" in current and "10⁶" in current and "(first)" in current
    assert "memory-coupled fragmentation" in current
    # written as people write weights, it publishes the same numbers
    url = f"/admin/pools/schedulingpolicyversion/add/?policy={policy.pk}"
    body = {"policy": policy.pk, "weights": "bin_pack = 10^3\nspread = 2.5e6", "knobs": "{}"}
    reviewed = re.search(r'name="reviewed" value="(\w+)"', client.post(url, body).content.decode())
    client.post(url, {**body, "reviewed": reviewed.group(1)})
    assert policy.current.weights == {"bin_pack": 1000, "spread": 2500000}
    shown = client.get(f"/admin/pools/schedulingpolicyversion/{policy.current.pk}/change/")
    assert "2.5 × 10⁶" in shown.content.decode()


def test_a_weight_that_does_not_parse_is_a_field_error(client, policy_admin, pool):
    client.force_login(policy_admin)
    policy = pool.scheduling_policy
    url = f"/admin/pools/schedulingpolicyversion/add/?policy={policy.pk}"
    body = {"policy": policy.pk, "weights": "bin_pack: lots", "knobs": "{}"}
    html = client.post(url, body).content.decode()
    assert "Line 1: write `scorer = weight`" in html and 'id="policy-diff"' not in html
