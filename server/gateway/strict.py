"""The base of every OpenAI body model: known fields strictly typed, unknown ones kept to be logged."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class Strict(BaseModel):
    # NOTE: extra="allow" only to find and log the unknown fields (`schemas.ignored_fields`); nothing reads them
    model_config = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
