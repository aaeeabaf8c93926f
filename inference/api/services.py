"""From a validated request to a queued Job: model access, tier limits, tokenisation.

`arequest_prepare` does everything that can fail because of the client (all of
it before anything is reserved or queued, so a 4xx never costs engine time;
a `response_format` schema and a forced tool call's parameters are compiled
here too: inference.api.response_format, inference.api.tool_calls; a chat with
tools or tool calls in its history is rendered by inference.api.tool_prompt);
`ajob_submit` checks capacity and enqueues. Views and the WebSocket consumer
share both.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from dataclasses import dataclass

from common.cache import TtlCache
from common.errors import ApiError, InvalidRequest, ServiceUnavailable
from inference.api.capacity import capacity_check, queue_outage
from inference.api.model_access import ModelInfo, amodel_info_get, context_limit, model_access_check
from inference.api.schemas import CHAT, ApiRequest, api_param
from inference.api.response_format import aresponse_format_check
from inference.api.tool_calls import ToolSpec, atools_check
from inference.api.tool_prompt import render_tool_prompt
from inference.metrics.gateway import refusal_count

logger = logging.getLogger(__name__)

# Prompts longer than this many characters are tokenised off the event loop.
INLINE_TOKENIZE_CHARS = 8192
INFERENCE_SCOPE = "inference"

# tokenizer source -> its tokenizer (metadata only), for the life of the process: a model's file does not change
_tokenizers: TtlCache[str, object] = TtlCache("tokenizers", ttl=None, max_entries=64)
_queue_outage = queue_outage()


@dataclass(slots=True)
class PreparedRequest:
    request: ApiRequest
    request_id: str
    created: int  # unix seconds, the `created` of every response object
    auth: object  # tenants.services.api_keys.AuthContext
    model: ModelInfo
    prompt_token_ids: list[int]
    sampling: dict  # SamplingParams.to_dict(), the Job's wire form
    max_tokens: int
    admission: object = None  # billing.services.admission_reserve.Admission, once admitted (ajob_submit)
    batch_id: str = ""  # a Batch API line's batch: its job runs below every tier, billed at the batch price


def request_id_new() -> str:
    return uuid.uuid4().hex


# ---------------------------------------------------------------- tokenisation
def _load_tokenizer(source: str):
    from inference.engine.tokenizer import load_tokenizer

    return load_tokenizer(source)


def tokenizer_get(*, model: ModelInfo):
    """The model's tokenizer (metadata only, cached for the life of the process); a file that cannot be loaded
    is the operator's problem, not the client's: 503."""
    tokenizer = _tokenizers.get(model.tokenizer_source)
    if tokenizer is None:
        try:
            tokenizer = _load_tokenizer(model.tokenizer_source)
        except Exception as exc:
            raise ServiceUnavailable(f"The tokenizer of `{model.name}` could not be loaded: {exc}",
                                     code="model_unavailable") from exc
        _tokenizers.set(model.tokenizer_source, tokenizer)
    return tokenizer


async def atokenizer_get(*, model: ModelInfo):
    """tokenizer_get; the first load runs off the event loop."""
    tokenizer = _tokenizers.get(model.tokenizer_source)
    if tokenizer is not None:
        return tokenizer
    return await asyncio.to_thread(tokenizer_get, model=model)


def prompt_tokens_count(*, request: ApiRequest, model: ModelInfo) -> int:
    """The prompt's token count as `arequest_prepare` would make it, for synchronous callers (a batch's
    validation). A prompt the live path would refuse (no chat template, a template's refusal, an id outside the
    vocabulary) raises the same InvalidRequest."""
    tokenizer = tokenizer_get(model=model)
    template = chat_template_get(model=model, tokenizer=tokenizer) if request.endpoint == CHAT else None
    return len(prompt_tokenize(request=request, tokenizer=tokenizer, chat_template=template))


def chat_template_get(*, model: ModelInfo, tokenizer) -> str:
    """The model's chat template: its row's, else its files'; a base model without one: 400 for chat."""
    template = model.chat_template or tokenizer.chat_template
    if not template:
        raise InvalidRequest(
            f"The model `{model.name}` has no chat template (a base model): use /v1/completions with a prompt, "
            f"or ask the operator to give it one (manage.py model_add {model.name} --chat-template FILE).",
            param="model", code="chat_template_missing")
    return template


def chat_encode(*, messages: list[dict], template: str, tokenizer, tools: ToolSpec | None = None,
                tool_prompt: bool = False) -> list[int]:
    """The messages rendered with `template` (the model's own BOS/EOS tokens), then tokenized. With
    `tool_prompt` (tools given, or calls in the history): inference.api.tool_prompt's rendering, the tools
    listed unless tool_choice is "none"."""
    from inference.engine.chat_template import ChatTemplateError, render_chat_template

    try:
        if tool_prompt:
            listed = tools.tools if tools is not None and tools.choice != "none" else None
            text = render_tool_prompt(messages, listed, template, bos_token=tokenizer.bos_token,
                                      eos_token=tokenizer.eos_token)
        else:
            text = render_chat_template(template, messages, add_generation_prompt=True,
                                        bos_token=tokenizer.bos_token, eos_token=tokenizer.eos_token)
    except ChatTemplateError as exc:  # e.g. the template's raise_exception on roles it does not take
        raise InvalidRequest(f"The model's chat template refused these messages: {exc}", param="messages") from None
    return list(tokenizer.encode(text))


def prompt_tokenize(*, request: ApiRequest, tokenizer, chat_template: str | None = None) -> list[int]:
    """Token ids of the prompt: the chat template for chat, the raw text (or ids) for completions."""
    if request.endpoint == CHAT:
        if chat_template is None:
            return list(tokenizer.encode_chat(request.messages))
        return chat_encode(messages=request.messages, template=chat_template, tokenizer=tokenizer,
                           tools=request.tools, tool_prompt=request.tool_prompt)
    if request.prompt_token_ids is not None:
        vocab = tokenizer.vocab_size
        for index, token in enumerate(request.prompt_token_ids):
            if token >= vocab:
                raise InvalidRequest(f"Invalid 'prompt': token id {token} at position {index} is outside the vocabulary (size {vocab}).", param="prompt")
        return list(request.prompt_token_ids)
    ids = list(tokenizer.encode(request.prompt, add_special_tokens=True))
    if not ids:  # an empty prompt starts from the document boundary, like OpenAI's <|endoftext|>
        start = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id
        ids = [start]
    return ids


def _prompt_chars(request: ApiRequest) -> int:
    if request.messages is not None:
        calls = sum(len(c["function"]["arguments"]) for m in request.messages for c in m.get("tool_calls", ()))
        return sum(len(m["content"] or "") for m in request.messages) + calls
    return len(request.prompt or "")


# ---------------------------------------------------------------- limits and sampling
def _max_tokens_resolve(*, request: ApiRequest, tier, prompt_len: int, limit: int) -> int:
    param = request.max_tokens_param
    tier_cap = tier.max_output_tokens
    if request.max_tokens is not None and request.max_tokens > tier_cap:
        raise InvalidRequest(
            f"Invalid '{param}': {request.max_tokens} is above the {tier_cap} output tokens per request "
            f"allowed on the '{tier.name}' tier.",
            param=param,
            code="invalid_value",
        )
    if request.max_tokens is None:
        remaining = limit - prompt_len
        if remaining < 1:
            raise _context_exceeded(request=request, limit=limit, prompt_len=prompt_len, max_tokens=None)
        return min(remaining, tier_cap)
    if prompt_len + request.max_tokens > limit:
        raise _context_exceeded(request=request, limit=limit, prompt_len=prompt_len, max_tokens=request.max_tokens)
    return request.max_tokens


def _context_exceeded(*, request: ApiRequest, limit: int, prompt_len: int, max_tokens: int | None) -> InvalidRequest:
    where = request.prompt_param
    if max_tokens is None:
        detail = f"your {where} resulted in {prompt_len} tokens, which leaves no room for the completion"
    else:
        detail = (
            f"you requested {prompt_len + max_tokens} tokens ({prompt_len} in the {where}, "
            f"{max_tokens} in the completion)"
        )
    return InvalidRequest(
        f"This model's maximum context length is {limit} tokens. However, {detail}. "
        f"Please reduce the length of the {where} or completion.",
        param=where,
        code="context_length_exceeded",
    )


def sampling_build(*, request: ApiRequest, max_tokens: int, vocab_size: int | None) -> dict:
    """SamplingParams for the engine, validated the way the engine will validate them."""
    from inference.engine.sampling_params import EngineValidationError, SamplingParams

    try:
        params = SamplingParams(max_tokens=max_tokens, logprobs=request.logprobs, **request.sampling)
        params.validate(vocab_size=vocab_size)
    except EngineValidationError as exc:
        param = api_param(exc.param, endpoint=request.endpoint, max_tokens_param=request.max_tokens_param)
        raise InvalidRequest(exc.message, param=param, code="invalid_value") from None
    sampling = params.to_dict()
    if sampling.get("structured_output") is None:  # absent, not null: a worker from before it reads other jobs
        sampling.pop("structured_output", None)
    return sampling


# ---------------------------------------------------------------- prepare + submit
async def arequest_prepare(*, auth, request: ApiRequest, request_id: str | None = None) -> PreparedRequest:
    """Every client-caused failure (404 model, 400 limits/context) before anything is queued."""
    api_key = getattr(auth, "api_key", None)
    if api_key is not None and hasattr(api_key, "has_scope") and not api_key.has_scope(INFERENCE_SCOPE):
        raise ApiError("This API key does not have the 'inference' scope.", status=403, error_type="permission_error", code="missing_scope")
    info = await amodel_info_get(name=request.model)
    model_access_check(tier=auth.tier, model=info.name)
    tokenizer = await atokenizer_get(model=info)
    template = chat_template_get(model=info, tokenizer=tokenizer) if request.endpoint == CHAT else None
    if _prompt_chars(request) > INLINE_TOKENIZE_CHARS:
        prompt_ids = await asyncio.to_thread(prompt_tokenize, request=request, tokenizer=tokenizer,
                                             chat_template=template)
    else:
        prompt_ids = prompt_tokenize(request=request, tokenizer=tokenizer, chat_template=template)
    limit = context_limit(tier=auth.tier, info=info)
    max_tokens = _max_tokens_resolve(request=request, tier=auth.tier, prompt_len=len(prompt_ids), limit=limit)
    sampling = sampling_build(request=request, max_tokens=max_tokens, vocab_size=tokenizer.vocab_size)
    if request.response_format is not None:  # the schema through the engine's compiler (cached, off the loop)
        await aresponse_format_check(spec=request.response_format)
    if request.tools is not None:  # a forced call's functions' parameters, the same way
        await atools_check(spec=request.tools)
    if template is not None and not sampling["ignore_eos"]:  # a reply ends with its turn (Gemma: <end_of_turn>)
        stops = sampling["stop_token_ids"]
        stops += [i for i in tokenizer.end_of_turn_ids(template) if i not in stops]
    return PreparedRequest(
        request=request,
        request_id=request_id or request_id_new(),
        created=int(time.time()),
        auth=auth,
        model=info,
        prompt_token_ids=prompt_ids,
        sampling=sampling,
        max_tokens=max_tokens,
    )


# Refusals of what a request's body holds (invalid JSON, too large, invalid parameters, unknown model, too long
# a prompt): each counts one request against the key's requests per minute, as an admitted one would.
BODY_REFUSAL_STATUSES = frozenset({400, 404, 413})


async def arequest_refused_count(*, auth, request_id: str, error: ApiError) -> None:
    """Count a request refused for its body against the requests-per-minute limits of its tenant and key (one
    backend call, no tokenizing): a client cannot send bad or oversize bodies for free. The error gets the
    `x-ratelimit-*-requests` headers of the count."""
    if error.status_code not in BODY_REFUSAL_STATUSES:
        return
    from billing.services.admission_reserve import aadmission_count_request

    headers = await aadmission_count_request(auth=auth, request_id=request_id)
    error.headers = {**headers, **error.headers}


def job_build(*, prepared: PreparedRequest, reply_channel: str):
    from django.conf import settings

    from inference.queue.job import Job
    from inference.queue.routing import RoutingPolicy, prefix_keys

    auth = prepared.auth
    salt = auth.tenant.cache_salt or f"tenant:{auth.tenant.pk}"
    keys = (prefix_keys(prepared.prompt_token_ids, salt, block_tokens=settings.ROUTING_BLOCK_TOKENS)
            if RoutingPolicy.from_settings().enabled else [])
    return Job(
        request_id=prepared.request_id,
        tenant_id=auth.tenant.pk,
        api_key_id=auth.api_key.pk if auth.api_key is not None else None,
        tier=auth.tier.name,
        # a batch line below every tier: the engine's scheduler preempts it for any live request
        priority=settings.BATCH_ENGINE_PRIORITY if prepared.batch_id else auth.tier.priority,
        model=prepared.model.name,
        prompt_token_ids=prepared.prompt_token_ids,
        sampling=prepared.sampling,
        reply_channel=reply_channel,
        enqueued_at=time.time(),
        reservation_id=prepared.request_id if getattr(prepared.admission, "reserved", False) else None,
        cache_salt=auth.tenant.cache_salt,
        endpoint=prepared.request.endpoint,
        tenant_slug=auth.tenant.slug,
        batch_id=prepared.batch_id,
        prefix_keys=keys,
    )


async def ajob_submit(*, prepared: PreparedRequest):
    """Check capacity, admit (limits, quota, budget) and enqueue; returns the JobRun to read events
    from (use `async with`). A request that is admitted but not queued gives its reservation back; one
    whose process dies between the two leaves nothing held past ADMISSION_LEASE_S
    (billing.services.admission_lease)."""
    from billing.services.admission_reserve import aadmission_reserve
    from billing.services.price_cache import aprice_in_force_check

    try:
        await aprice_in_force_check(model=prepared.model.name)  # a model whose price cannot be read: 503
        await capacity_check(prepared.model.name)
        prepared.admission = await aadmission_reserve(
            auth=prepared.auth, request_id=prepared.request_id, model=prepared.model.name,
            prompt_tokens=len(prepared.prompt_token_ids), max_tokens=prepared.max_tokens,
            batch=bool(prepared.batch_id),
        )
    except ApiError as exc:
        refusal_count(model=prepared.model.name, tier=prepared.auth.tier.name, code=exc.code)
        raise
    from billing.services.admission_lease import AdmissionLease, aadmission_confirm

    try:
        async with AdmissionLease(prepared.admission):  # renewed while in this process's hands
            run = await _enqueue(prepared)
    except BaseException as exc:
        from billing.services.admission_reserve import aadmission_release

        if isinstance(exc, ApiError):  # queue full
            refusal_count(model=prepared.model.name, tier=prepared.auth.tier.name, code=exc.code)
        await asyncio.shield(aadmission_release(admission=prepared.admission))
        raise
    await aadmission_confirm(admission=prepared.admission)  # on the queue: held until the worker settles it
    return run


async def _enqueue(prepared: PreparedRequest):
    from channels.layers import get_channel_layer

    from inference.api.job_run import JobRun, job_cancel
    from inference.api.replies import reply_channel_get
    from inference.queue import QueueFull, QueueUnavailable, get_job_queue

    reply = await reply_channel_get(get_channel_layer())
    await reply.alive()  # a worker cancels the jobs of a channel whose liveness key is gone
    job = job_build(prepared=prepared, reply_channel=reply.name)
    # Waiting before it is queued: the first event may come before enqueue() returns.
    run = JobRun(reply=reply, request_id=prepared.request_id, model=prepared.model.name)
    queue = get_job_queue()
    try:
        await queue.aenqueue(job)  # in-process: a lock and a notify; Redis: the script, from a thread
    except QueueUnavailable as exc:
        run.release()
        _queue_outage.failed(exc.__cause__ or exc)
        raise
    except QueueFull as exc:
        run.release()
        raise ServiceUnavailable(
            "The queue for this model and tier is full. Please retry later.", code="queue_full", headers={"Retry-After": "2"}
        ) from exc
    except asyncio.CancelledError:
        run.release()
        job_cancel(request_id=job.request_id)  # the client left while the enqueue was in flight
        raise
    except BaseException:
        run.release()
        raise
    return run
