"""The render endpoints: a completion or chat request's prompt as the model server would run it, no generation.

`POST /v1/completions/render` and `POST /v1/chat/completions/render` take the body of the endpoint they are
named after and answer in vLLM's shape (its `GenerateRequest`: `token_ids`, `sampling_params`, `model`, ...; a
list of them, one per prompt, for completions), which an endpoint picker reads to score prefix-cache hits
from token ids. Each prompt is the model server's Tokenize of the Generate the request would send, with its
sampling parameters: the same input processor renders the chat template and tools and tokenizes, and checks
the request as Generate does (the context limit, max_tokens), so a render and a completion of one body never
disagree.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from google.protobuf.json_format import MessageToDict

from infer.api import pb
from infer.server.gateway import translate
from infer.server.gateway.render import Json
from infer.server.gateway.schemas import Sampling
from infer.server.gateway.upstream import Metadata, Upstream


async def tokenize(
    upstream: Upstream, requests: Sequence[pb.GenerateRequest], metadata: Metadata
) -> list[pb.TokenizeResponse]:
    """Each request's prompt ids, checked as its Generate would be (the first refusal raises its APIError)."""
    return list(await asyncio.gather(*(upstream.tokenize(translate.tokenize_request(r), metadata) for r in requests)))


def rendered(
    request_id: str, model: str, body: Sampling, request: pb.GenerateRequest, prompt: pb.TokenizeResponse
) -> Json:
    """One prompt in vLLM's GenerateRequest shape; `prompt` is infer's own: the text its ids were encoded from
    (a chat: the rendered template; null for token ids)."""
    stream_options = body.stream_options.model_dump(exclude_none=True) if body.stream and body.stream_options else None
    return {
        "request_id": request_id,
        "token_ids": list(prompt.token_ids),
        "features": None,  # NOTE: text only: no multimodal placeholders
        "sampling_params": sampling_params(request.sampling, body.n, prompt.max_tokens),
        "model": model,
        "stream": body.stream,
        "stream_options": stream_options,
        "cache_salt": None,
        "priority": request.sampling.priority,
        "kv_transfer_params": None,
        "prompt": prompt.text or None,
    }


def sampling_params(params: pb.SamplingParams, n: int, max_tokens: int) -> Json:
    """The parameters the request set, by infer.v1's names (`json_schema`, `regex`, ... for a constraint), with
    `n` and the max_tokens Generate runs with (a chat's default: what the context leaves)."""
    out: dict[str, Any] = {"n": n}
    for field, value in params.ListFields():
        if field.name == "max_tokens_from_context":
            continue
        if field.message_type is not None:  # a constraint's Choices or JsonObject
            out[field.name] = MessageToDict(value, preserving_proto_field_name=True)
        else:
            out[field.name] = value if isinstance(value, bool | int | float | str) else list(value)  # stop, stop ids
    return out | {"max_tokens": max_tokens}
