"""Who asks: a request's tenant, and what the operator says of tenants (the tenants file).

A request's tenant is, on a server with API keys, its key's (`security.ApiKeys`: the key's name in the keys
file, else `key-` and 8 hex digits of its SHA-256); on a server without keys, the value of the gRPC metadata
(HTTP header) the operator names with `tenant_header`; else the one default tenant. A keyed server ignores the
header: the key decides.

The tenants file (`--tenants FILE`): one tenant a line, `name weight [tokens_per_minute]`; a word that starts
with `#` starts a comment, blank lines are skipped. `weight` (> 0) is the tenant's share under the fair policy;
`tokens_per_minute` its token budget: a whole number >= 1, or `none` for no budget; left out, the default
budget. A tenant the file does not name weighs 1 and has the default budget.

What the server keeps per tenant is bounded by `max_tenants` (`--max-tenants`): the token buckets here
(budgets.py), and the fair policy's counters in the engine (engine/policies/fair.py); idle tenants are forgotten past
it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from infer.api import API_KEY_METADATA, bearer_key
from infer.engine import DEFAULT_MAX_TENANTS, DEFAULT_TENANT, InvalidInput
from infer.server.budgets import TokenBudgets
from infer.server.security import MAX_TENANT_CHARS, TENANT_NAME, ApiKeys

OTHER_TENANTS = "other"  # the metrics' label of every tenant the file does not name (bounded cardinality)
TENANTS_LINE = "expected 'name weight [tokens_per_minute]'"


@dataclass(frozen=True)
class Tenant:
    name: str
    weight: float = 1.0
    tokens_per_minute: int | None = None  # None: no budget


@dataclass(frozen=True)
class TenantTable:
    """The tenants file, read: the named tenants and the budget of the others."""

    named: dict[str, Tenant] = field(default_factory=dict)
    default_tokens_per_minute: int | None = None  # the budget of a tenant the file does not give one; None: none

    @classmethod
    def read(cls, path: str | None, default_tokens_per_minute: int | None = None) -> TenantTable:
        """ValueError naming the file and the line when a line does not parse (or the file cannot be read)."""
        if path is None:
            return cls({}, default_tokens_per_minute)
        try:
            text = Path(path).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise ValueError(f"tenants_file: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        return cls.parse(text.splitlines(), path, default_tokens_per_minute)

    @classmethod
    def parse(cls, lines: Iterable[str], path: str, default_tokens_per_minute: int | None = None) -> TenantTable:
        named: dict[str, Tenant] = {}
        for number, line in enumerate(lines, 1):
            words = line.split()
            words = words[: next((i for i, w in enumerate(words) if w.startswith("#")), len(words))]
            if not words:  # blank, or a comment
                continue
            try:
                tenant = _tenant(words, default_tokens_per_minute)
            except ValueError as e:
                raise ValueError(f"tenants_file: {path} line {number}: {e}") from None
            if tenant.name in named:
                raise ValueError(f"tenants_file: {path} line {number}: {tenant.name!r} is named twice")
            named[tenant.name] = tenant
        return cls(named, default_tokens_per_minute)

    @property
    def weights(self) -> tuple[tuple[str, float], ...]:
        """EngineConfig.tenant_weights: the weights that are not 1."""
        return tuple((t.name, t.weight) for t in self.named.values() if t.weight != 1.0)

    def tokens_per_minute(self, tenant: str) -> int | None:
        """The tenant's budget; None: none."""
        found = self.named.get(tenant)
        return self.default_tokens_per_minute if found is None else found.tokens_per_minute


def _tenant(words: list[str], default_tokens_per_minute: int | None) -> Tenant:
    if len(words) not in (2, 3):
        raise ValueError(f"{TENANTS_LINE}, got {len(words)} word(s)")
    name = words[0]
    if not TENANT_NAME.match(name) or name == OTHER_TENANTS:
        raise ValueError(f"tenant name {name[:80]!r}: 1 to {MAX_TENANT_CHARS} visible ASCII characters, not 'other'")
    try:
        weight = float(words[1])
    except ValueError:
        raise ValueError(f"weight {words[1][:80]!r}: not a number ({TENANTS_LINE})") from None
    if not (weight > 0 and math.isfinite(weight)):
        raise ValueError(f"weight {words[1]!r}: must be > 0")
    if len(words) == 2:
        return Tenant(name, weight, default_tokens_per_minute)
    if words[2].lower() == "none":
        return Tenant(name, weight, None)
    if not words[2].isdigit() or int(words[2]) < 1:
        raise ValueError(f"tokens_per_minute {words[2][:80]!r}: a whole number >= 1, or none")
    return Tenant(name, weight, int(words[2]))


class TenantIdentity:
    """A request's tenant from its metadata: the API key's, else the tenant header's, else the default."""

    def __init__(self, keys: ApiKeys | None = None, header: str | None = None) -> None:
        self.keys, self.header = keys, header

    def tenant(self, metadata: Iterable[tuple[str, str | bytes]]) -> str:
        """InvalidInput naming the header when its value is not a tenant name (or it is sent twice)."""
        metadata = list(metadata)
        if self.keys is not None:
            key = bearer_key(next((str(v) for k, v in metadata if k == API_KEY_METADATA), None))
            return (self.keys.tenant_of(key) if key is not None else None) or DEFAULT_TENANT
        if self.header is None:
            return DEFAULT_TENANT
        values = [v for k, v in metadata if k == self.header]
        if not values:
            return DEFAULT_TENANT
        if len(values) > 1:
            raise InvalidInput(self.header, f"sent {len(values)} times; send it once")
        value = values[0]
        if not isinstance(value, str) or not TENANT_NAME.match(value):
            raise InvalidInput(self.header, f"a tenant is 1 to {MAX_TENANT_CHARS} visible ASCII characters")
        return value


class Tenants:
    """What the servicer asks of tenants: who asks (`identity`), its metrics label (`label`: a tenant the tenants
    file or the keys file names, or the default tenant, is its own label; any other is "other", so the labels are
    bounded by the operator's files, not by what callers send), and the token budgets (`budgets`: at most
    `max_tenants` tenants' buckets)."""

    def __init__(
        self,
        identity: TenantIdentity | None = None,
        table: TenantTable | None = None,
        clock: Callable[[], float] = time.monotonic,
        max_tenants: int = DEFAULT_MAX_TENANTS,
    ) -> None:
        self.identity = identity or TenantIdentity()
        self.table = table or TenantTable()
        self.budgets = TokenBudgets(self.table.tokens_per_minute, clock, max_tenants)
        keys = self.identity.keys
        self.labels = frozenset(self.table.named) | (keys.names if keys is not None else frozenset()) | {DEFAULT_TENANT}

    def label(self, tenant: str) -> str:
        return tenant if tenant in self.labels else OTHER_TENANTS

    @property
    def num_tracked(self) -> int:
        """Tenants whose state is kept here (their token buckets)."""
        return len(self.budgets)
