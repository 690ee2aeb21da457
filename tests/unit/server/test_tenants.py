"""Who asks (server/tenants.py): the tenants file, read or refused naming its line; a request's tenant from its API
key's name, else the operator's header on a keyless server, else the default tenant."""

from __future__ import annotations

from pathlib import Path

import pytest

from infer.engine import DEFAULT_TENANT, InvalidInput
from infer.server.security import ApiKeys, header_problem
from infer.server.tenants import OTHER_TENANTS, TenantIdentity, Tenants, TenantTable

# the tenants file


def test_a_tenants_file_gives_weights_and_budgets(tmp_path: Path) -> None:
    path = tmp_path / "tenants"
    path.write_text("# name weight [tokens per minute]\n\ngold  4  600000\nfree 0.5\n  batch 1 none  # no budget\n")
    table = TenantTable.read(str(path), default_tokens_per_minute=1000)
    assert set(table.named) == {"gold", "free", "batch"}
    assert table.weights == (("gold", 4.0), ("free", 0.5))  # weight 1 is every tenant's default
    assert table.tokens_per_minute("gold") == 600000
    assert table.tokens_per_minute("free") == 1000  # left out: the default budget
    assert table.tokens_per_minute("batch") is None  # none: no budget
    assert table.tokens_per_minute("someone-else") == 1000
    assert TenantTable.read(None).weights == () and TenantTable.read(None).tokens_per_minute("x") is None


def test_metric_labels_are_the_named_tenants_the_default_and_other() -> None:
    keys = ApiKeys([("team-a", "sk-a"), "sk-anon"])
    tenants = Tenants(TenantIdentity(keys), TenantTable.parse(["gold 2"], "tenants"))
    anon = keys.tenant_of("sk-anon")
    assert anon is not None
    labels = [tenants.label(t) for t in ("gold", "team-a", DEFAULT_TENANT, anon, "x", OTHER_TENANTS)]
    assert labels == ["gold", "team-a", DEFAULT_TENANT, OTHER_TENANTS, OTHER_TENANTS, OTHER_TENANTS]


def test_the_state_kept_per_tenant_stays_at_max_tenants() -> None:
    tenants = Tenants(TenantIdentity(header="x-tenant"), TenantTable({}, default_tokens_per_minute=600), max_tenants=50)
    for i in range(2_000):  # the tenant header's values: a new one per request
        tenant = tenants.identity.tenant([("x-tenant", f"caller-{i}")])
        tenants.budgets.check(tenant, 10)
        tenants.budgets.charge(tenant, 10)
        assert tenants.num_tracked <= 50
    assert tenants.num_tracked > 25 and tenants.label("caller-1999") == OTHER_TENANTS


@pytest.mark.parametrize(
    ("line", "problem"),
    [
        ("gold", "expected 'name weight [tokens_per_minute]', got 1 word"),
        ("gold 2 100 extra", "got 4 word"),
        ("gold heavy", "weight 'heavy': not a number"),
        ("gold 0", "weight '0': must be > 0"),
        ("gold -1", "must be > 0"),
        ("gold inf", "must be > 0"),
        ("gold nan", "must be > 0"),
        ("gold 1 0", "tokens_per_minute '0': a whole number >= 1, or none"),
        ("gold 1 1.5", "tokens_per_minute '1.5'"),
        ("other 1", "not 'other'"),
        ("gold 1\ngold 2", "'gold' is named twice"),
    ],
)
def test_a_tenants_file_that_does_not_parse_is_refused_naming_the_line(tmp_path: Path, line: str, problem: str) -> None:
    path = tmp_path / "tenants"
    path.write_text(f"# tenants\nfree 1\n{line}\n")
    with pytest.raises(ValueError) as e:
        TenantTable.read(str(path))
    line_number = 3 + line.count("\n")
    assert str(e.value).startswith(f"tenants_file: {path} line {line_number}: "), e.value
    assert problem in str(e.value)


def test_an_unreadable_tenants_file_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"tenants_file: cannot read .*missing"):
        TenantTable.read(str(tmp_path / "missing"))
    (tmp_path / "binary").write_bytes(b"\xff\xfe gold 1")
    with pytest.raises(ValueError, match="tenants_file: cannot read"):
        TenantTable.read(str(tmp_path / "binary"))


# who asks


def test_a_named_key_is_its_tenant_and_an_unnamed_one_a_label_of_its_own() -> None:
    keys = ApiKeys([("team-a", "sk-a1"), ("team-a", "sk-a2"), "sk-anon"])
    identity = TenantIdentity(keys, header="x-tenant")
    assert identity.tenant([("authorization", "Bearer sk-a1")]) == "team-a"
    assert identity.tenant([("authorization", "bearer sk-a2")]) == "team-a"  # two keys, one tenant
    anon = identity.tenant([("authorization", "Bearer sk-anon")])
    assert anon.startswith("key-") and len(anon) == 12 and "sk-anon" not in anon
    assert anon == TenantIdentity(ApiKeys(["sk-anon"])).tenant([("authorization", "Bearer sk-anon")])  # stable


def test_on_a_keyed_server_the_tenant_header_is_ignored() -> None:
    identity = TenantIdentity(ApiKeys([("team-a", "sk-a")]), header="x-tenant")
    for value in ("team-b", "not a tenant\t", "x" * 500):
        assert identity.tenant([("authorization", "Bearer sk-a"), ("x-tenant", value)]) == "team-a"


def test_on_a_keyless_server_the_header_names_the_tenant() -> None:
    identity = TenantIdentity(header="x-tenant")
    assert identity.tenant([("x-tenant", "team-b"), ("user-agent", "grpc")]) == "team-b"
    assert identity.tenant([("user-agent", "grpc")]) == DEFAULT_TENANT
    assert TenantIdentity().tenant([("x-tenant", "team-b")]) == DEFAULT_TENANT  # no header configured


@pytest.mark.parametrize("metadata", [[("x-tenant", "")], [("x-tenant", "a b")], [("x-tenant", "x" * 65)],
                                      [("x-tenant", "a"), ("x-tenant", "b")]])  # fmt: skip
def test_a_bad_tenant_header_is_invalid_argument_naming_it(metadata: list[tuple[str, str]]) -> None:
    with pytest.raises(InvalidInput) as e:
        TenantIdentity(header="x-tenant").tenant(metadata)
    assert e.value.field == "x-tenant"


@pytest.mark.parametrize(
    ("name", "ok"),
    [("x-tenant", True), ("tenant_id", True), ("X-Tenant", False), ("authorization", False), ("grpc-tenant", False),
     ("x-tenant-bin", False), ("x tenant", False), ("", False)],
)  # fmt: skip
def test_the_tenant_header_must_be_a_header_grpc_carries_as_text(name: str, ok: bool) -> None:
    assert (header_problem(name) is None) is ok
