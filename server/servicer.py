"""The infer.v1 servicer: translates proto <-> engine calls, and errors into gRPC status codes."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError, Message

from infer.api import SERVICE, SERVICE_NAME, pb, pb_grpc
from infer.engine import CallerOutputs, EngineClient, FinishReason, InvalidInput, ProcessedInput, Refusal
from infer.server import convert
from infer.server.budgets import BudgetExceededError
from infer.server.lifecycle import Lifecycle
from infer.server.limits import RequestLimits
from infer.server.prompt_workers import PromptWorkers
from infer.server.status import StatusError, status_of
from infer.server.telemetry import RequestTrace, Telemetry
from infer.server.tenants import Tenants


def _cancelled_code(context: grpc.aio.ServicerContext) -> str:
    remaining = context.time_remaining()
    return "DEADLINE_EXCEEDED" if remaining is not None and remaining <= 0 else "CANCELLED"


class InferenceServicer(pb_grpc.InferenceServiceServicer):
    def __init__(
        self,
        lifecycle: Lifecycle,
        telemetry: Telemetry,
        limits: RequestLimits | None = None,
        prompt_workers: PromptWorkers | None = None,
        tenants: Tenants | None = None,
    ) -> None:
        self.lifecycle, self.telemetry = lifecycle, telemetry
        self.tenants = tenants or Tenants()  # who asks (the API key's name, or the tenant header), their budgets
        telemetry.track_tenants(self.tenants)
        self.limits = limits or RequestLimits()
        self.prompt_workers = prompt_workers or PromptWorkers(self.limits.max_pending_long_prompts)

    @contextlib.asynccontextmanager
    async def _rpc(
        self, context: grpc.aio.ServicerContext, method: str, request_id: str = ""
    ) -> AsyncIterator[tuple[EngineClient, RequestTrace]]:
        """Count the RPC in flight, trace it, and turn an exception into its status (`status.py`)."""
        trace = self.telemetry.start_request(method, request_id, dict(context.invocation_metadata() or ()))
        try:
            with self.lifecycle.in_flight() as engine:
                yield engine, trace
        except asyncio.CancelledError:
            trace.end(_cancelled_code(context))
            raise
        except Exception as e:
            if context.cancelled():  # a write that failed because the client is gone: grpc cleans up
                trace.end(_cancelled_code(context))
                raise
            status = status_of(e)
            trace.end(status.code.name, status.message)
            await context.abort(status.code, status.message, trailing_metadata=status.trailing_metadata)
        else:
            trace.end("OK")

    # NOTE: a coroutine that writes, not an async generator that yields: grpc.aio drives a generator with
    # `async for` and never closes it when a cancel lands during a send, so its cleanup (the engine abort,
    # the in-flight count) would wait for garbage collection. Here the cancel surfaces in `context.write`.
    async def Generate(  # noqa: N802 (gRPC method names)
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> None:
        request_id = request.request_id or uuid.uuid4().hex
        engine_id = convert.engine_request_id(request_id, request)
        async with self._rpc(context, "Generate", engine_id) as (engine, trace):
            convert.check_request_id(request.request_id)
            tenant = self.tenants.identity.tenant(context.invocation_metadata() or ())
            trace.for_tenant(self.tenants.label(tenant))
            params = convert.sampling_params(request.sampling)
            bounds = self.limits.bounds(engine.config.max_model_len)
            size = convert.checked_input_size(request, bounds)  # before any template or tokenizer work
            processed = await self.prompt_workers.run(
                size, lambda: engine.process(convert.prompt(request), params, bounds.engine)
            )
            await _compiled(engine, processed)
            num_prompt_tokens = len(processed.prompt_token_ids)
            _admit_by_deadline(engine, num_prompt_tokens, context.time_remaining())
            self._check_budget(tenant, num_prompt_tokens, trace)
            outputs = CallerOutputs.of(processed, engine.tokenizer)  # logprob tokens' text, tool calls
            async with engine.submit(processed, engine_id, tenant) as stream:  # leaving early aborts it
                self.tenants.budgets.charge(tenant, num_prompt_tokens)  # NOTE: no await since the check
                trace.on_admitted(num_prompt_tokens)
                async for out in stream:
                    self.tenants.budgets.charge(tenant, len(out.token_ids))
                    trace.on_output(out)
                    if out.finish_reason is FinishReason.ERROR:
                        raise StatusError(grpc.StatusCode.INTERNAL, f"request {engine_id} failed: {out.error}")
                    if out.finish_reason is FinishReason.ABORT:
                        raise StatusError(grpc.StatusCode.CANCELLED, f"request {engine_id} was aborted")
                    await context.write(convert.generate_response(outputs(out), request_id))

    def _check_budget(self, tenant: str, num_prompt_tokens: int, trace: RequestTrace) -> None:
        try:
            self.tenants.budgets.check(tenant, num_prompt_tokens)
        except BudgetExceededError:
            trace.on_budget_refused()
            raise

    async def GetModelInfo(  # noqa: N802
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        async with self._rpc(context, "GetModelInfo") as (engine, _):
            return convert.model_info(engine)
        raise AssertionError("unreachable: _rpc aborts on error")

    async def Tokenize(  # noqa: N802
        self, request: pb.TokenizeRequest, context: grpc.aio.ServicerContext
    ) -> pb.TokenizeResponse:
        async with self._rpc(context, "Tokenize") as (engine, _):
            bounds = self.limits.bounds(engine.config.max_model_len)
            size = convert.checked_input_size(request, bounds)
            if request.HasField("sampling"):  # checked as Generate checks it (the render endpoints)
                params = convert.sampling_params(request.sampling)
                processed = await self.prompt_workers.run(
                    size, lambda: engine.process(convert.tokenize_prompt(request), params, bounds.engine)
                )
                await _compiled(engine, processed)  # what Generate refuses, a render refuses (tools, constraints)
            else:
                processed = await self.prompt_workers.run(
                    size, lambda: engine.tokenize(convert.tokenize_prompt(request), bounds.engine)
                )
            return convert.tokenize_response(request, processed)
        raise AssertionError("unreachable: _rpc aborts on error")


Handler = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]


def add_to_server(servicer: InferenceServicer, server: grpc.aio.Server) -> None:
    """Register the infer.v1 methods. NOTE: requests arrive as bytes and are parsed here, so a malformed one
    is INVALID_ARGUMENT (grpc's own deserializer would answer UNKNOWN)."""
    handlers = {}
    for method in SERVICE.methods:
        response_type = getattr(pb, method.output_type.name)
        parsing = _parsing(getattr(pb, method.input_type.name), getattr(servicer, method.name))
        make = grpc.unary_stream_rpc_method_handler if method.server_streaming else grpc.unary_unary_rpc_method_handler
        handlers[method.name] = make(parsing, response_serializer=response_type.SerializeToString)
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
    server.add_registered_method_handlers(SERVICE_NAME, handlers)


def _parsing(request_type: type[Message], handler: Handler) -> Handler:
    async def parse_then_handle(raw: bytes, context: grpc.aio.ServicerContext) -> Any:
        try:
            request = request_type.FromString(raw)
        except DecodeError as e:
            status = status_of(ValueError(f"malformed {request_type.DESCRIPTOR.name}: {e}"))  # INVALID_VALUE
            await context.abort(status.code, status.message, trailing_metadata=status.trailing_metadata)
        return await handler(request, context)

    return parse_then_handle


async def _compiled(engine: EngineClient, processed: ProcessedInput) -> None:
    """Wait for the constraints to compile (off the event loop; cached for the engine): every tool's
    parameters, whatever the tool_choice, and the output's; InvalidInput names the field that asked for the
    one that does not."""
    for field, constraint in processed.constraints:
        try:
            await engine.compile_constraint(constraint)
        except InvalidInput as e:  # NOTE: what compile_constraint refuses does not compile (EngineClient)
            refused = e.because(Refusal.DOES_NOT_COMPILE)
            raise (processed.constraint_error(refused) if field is None else refused.renamed(field)) from None


def _admit_by_deadline(engine: EngineClient, num_prompt_tokens: int, time_remaining_s: float | None) -> None:
    """Refuse at once when the work queued ahead already predicts a first token past the deadline."""
    if time_remaining_s is None:
        return
    predicted_s = engine.predict_ttft_s(num_prompt_tokens)
    if predicted_s > time_remaining_s:
        raise StatusError(
            grpc.StatusCode.DEADLINE_EXCEEDED,
            f"predicted time to first token {predicted_s:.2f} s exceeds the {time_remaining_s:.2f} s "
            "left before the deadline",
        )
