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


def test_editing_a_policy_publishes_a_new_version(client, policy_admin, pool):
    client.force_login(policy_admin)
    policy = pool.scheduling_policy
    response = client.post(
        "/admin/pools/schedulingpolicyversion/add/",
        {"policy": policy.pk, "weights": '{"bin_pack": 2}', "knobs": "{}", "comment": "pack"},
    )
    assert response.status_code == 302
    numbers = list(policy.versions.order_by("number").values_list("number", "weights"))
    assert numbers == [(1, numbers[0][1]), (2, {"bin_pack": 2})]
