"""Chat requests: OpenAI-style messages -> the prompt, rendered with a chat template, and its token ids.

The rendering follows vLLM 0.32's own chat path (`vllm.renderers.chat_utils.parse_chat_messages` and
`vllm.renderers.hf.safe_apply_chat_template`, what `LLM.chat` runs), so the token ids equal what vLLM would have
computed (a test proves it against `LLM.chat`):
  * the template decides the content format: a template that loops over `message.content` gets OpenAI-style
    parts (`{"type": "text", "text": ...}`, `{"type": "image"}`), any other gets one string per message (text
    parts joined with "\\n", one image placeholder per image in front, as vLLM does when it does not interleave);
  * tool messages get their text parts joined; assistant `tool_calls` arguments are decoded to objects;
  * transformers renders the template (in jinja2's ImmutableSandboxedEnvironment) and the text is tokenized
    without special tokens added, as `apply_chat_template(tokenize=True)` does.

vLLM is not imported here: the preprocess stage must start fast and stay small. The content-format detection
below is a port of vLLM's (`vllm/renderers/hf.py`, Apache-2.0).
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import jinja2
import jinja2.nodes
import jinja2.sandbox

from core.interface import InvalidInput
from core.stage import parse_bool, parse_json_container, parse_json_object

ROLES = ("system", "user", "assistant", "tool")
TEXT_PART_TYPES = ("text",)
IMAGE_PART_TYPES = ("image_url",)
# Keys that `chat_template_kwargs` may not set: they are chosen by this stage (vLLM refuses the same two).
RESERVED_TEMPLATE_KWARGS = frozenset({"chat_template", "tokenize"})

# Chat options: from request parameters and/or the `chat_options` JSON tensor (the tensor wins per key).
CHAT_OPTION_KEYS = frozenset(
    {"chat_template", "chat_template_kwargs", "add_generation_prompt", "continue_final_message", "tools", "documents"}
)


@dataclass
class ChatOptions:
    add_generation_prompt: bool = True  # vLLM's default in LLM.chat and the OpenAI server
    continue_final_message: bool = False
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] = field(default_factory=dict)
    tools: list[dict[str, Any]] | None = None
    documents: list[dict[str, Any]] | None = None


@dataclass
class Conversation:
    """Messages as the template sees them, and the image sources (data URLs or base64) in order."""

    messages: list[dict[str, Any]]
    image_sources: list[str]


def _list_of_objects(value: Any, field_name: str) -> list[dict[str, Any]]:
    value = parse_json_container(value, field_name)
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise InvalidInput(f"{field_name}: expected a list of JSON objects, got {value!r:.200}")
    return value


def parse_chat_options(
    tensor_json: str | None, request_parameters: Mapping[str, Any], *, allow_request_template: bool
) -> ChatOptions:
    """Request parameters (keys in CHAT_OPTION_KEYS) overlaid by the `chat_options` JSON tensor."""
    merged = {k: v for k, v in request_parameters.items() if k in CHAT_OPTION_KEYS}
    if tensor_json is not None:
        doc = parse_json_object(tensor_json, "chat_options")
        unknown = sorted(set(doc) - CHAT_OPTION_KEYS)
        if unknown:
            raise InvalidInput(
                f"chat_options: unknown key {unknown[0]!r} (known: {', '.join(sorted(CHAT_OPTION_KEYS))})"
            )
        merged.update(doc)

    options = ChatOptions()
    for key in ("add_generation_prompt", "continue_final_message"):
        if merged.get(key) is not None:
            setattr(options, key, parse_bool(merged[key], key))
    if merged.get("chat_template") is not None:
        template = merged["chat_template"]
        if not isinstance(template, str) or not template.strip():
            raise InvalidInput(f"chat_template: expected a non-empty template string, got {template!r:.100}")
        if not allow_request_template:
            raise InvalidInput(
                "chat_template: this deployment does not accept per-request chat templates"
                " (preprocess setting allow_request_chat_template is false)"
            )
        options.chat_template = template
    if merged.get("chat_template_kwargs") is not None:
        kwargs = parse_json_container(merged["chat_template_kwargs"], "chat_template_kwargs")
        if not isinstance(kwargs, dict):
            raise InvalidInput(f"chat_template_kwargs: expected a JSON object, got {kwargs!r:.200}")
        reserved = sorted(RESERVED_TEMPLATE_KWARGS & kwargs.keys())
        if reserved:
            raise InvalidInput(f"chat_template_kwargs: {reserved[0]!r} may not be set here")
        options.chat_template_kwargs = kwargs
    for key in ("tools", "documents"):
        if merged.get(key) is not None:
            setattr(options, key, _list_of_objects(merged[key], key))
    if options.continue_final_message and options.add_generation_prompt:
        if "add_generation_prompt" in merged and merged["add_generation_prompt"] is not None:
            raise InvalidInput("continue_final_message=true cannot be combined with add_generation_prompt=true")
        options.add_generation_prompt = False  # the default yields, as in vLLM's OpenAI server
    return options


# Messages ------------------------------------------------------------------------------------------------


def parse_messages(text: str) -> list[dict[str, Any]]:
    try:
        messages = json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidInput(f"messages: invalid JSON ({exc.msg} at position {exc.pos})") from None
    if not isinstance(messages, list) or not messages:
        raise InvalidInput("messages: expected a non-empty JSON list of message objects")
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            raise InvalidInput(f"messages[{i}]: expected an object with 'role' and 'content'")
        role = message.get("role")
        if role not in ROLES:
            raise InvalidInput(f"messages[{i}].role: {role!r} is not one of {', '.join(ROLES)}")
        content = message.get("content")
        if content is None and role != "assistant":
            raise InvalidInput(f"messages[{i}].content: required for role {role!r}")
        if content is not None and not isinstance(content, (str, list)):
            raise InvalidInput(f"messages[{i}].content: expected a string or a list of parts")
    return messages


def _image_source(part: Mapping[str, Any], where: str) -> str:
    image_url = part.get("image_url")
    url = image_url.get("url") if isinstance(image_url, dict) else image_url
    if not isinstance(url, str) or not url:
        raise InvalidInput(f"{where}.image_url: expected {{'url': 'data:image/...;base64,...'}} or base64")
    return url


def _content_parts(content: Any, where: str) -> Iterator[tuple[str, str]]:
    """(kind, value) per part: ("text", text) or ("image", source)."""
    if content is None:
        return
    if isinstance(content, str):
        yield "text", content
        return
    for j, part in enumerate(content):
        here = f"{where}[{j}]"
        if isinstance(part, str):
            yield "text", part
            continue
        if not isinstance(part, dict):
            raise InvalidInput(f"{here}: expected a content part object")
        kind = part.get("type")
        if kind is None and "image_url" in part:
            kind = "image_url"
        if kind in TEXT_PART_TYPES:
            text = part.get("text")
            if text is None:  # vLLM skips a text part without text
                continue
            if not isinstance(text, str):
                raise InvalidInput(f"{here}.text: expected a string")
            yield "text", text
        elif kind in IMAGE_PART_TYPES:
            yield "image", _image_source(part, here)
        else:
            raise InvalidInput(f"{here}.type: {kind!r} is not supported (supported: text, image_url)")


def _tool_calls(calls: Any, where: str) -> list[dict[str, Any]] | None:
    """vLLM's rule: tool call `arguments` reach the template as an object (a JSON string is decoded)."""
    if calls is None:
        return None
    if not isinstance(calls, list):
        raise InvalidInput(f"{where}: expected a list")
    if not calls:
        return None  # vLLM drops an empty list so templates take the plain assistant path
    result = []
    for k, call in enumerate(calls):
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or call.get("type", "function") != "function":
            raise InvalidInput(f"{where}[{k}]: expected {{'type': 'function', 'function': {{...}}}}")
        arguments = function.get("arguments")
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments else {}
            except json.JSONDecodeError:
                arguments = {}  # vLLM coerces malformed history arguments to {} rather than fail every turn
        if not isinstance(arguments, dict):
            arguments = {}
        result.append({**call, "function": {**function, "arguments": arguments}})
    return result


def build_conversation(messages: list[dict[str, Any]], content_format: str, image_placeholder: str) -> Conversation:
    conversation: list[dict[str, Any]] = []
    images: list[str] = []
    for i, message in enumerate(messages):
        role = message["role"]
        texts: list[str] = []
        parts: list[dict[str, Any]] = []
        message_images = 0
        for kind, value in _content_parts(message.get("content"), f"messages[{i}].content"):
            if kind == "text":
                texts.append(value)
                parts.append({"type": "text", "text": value})
            else:
                images.append(value)
                message_images += 1
                parts.append({"type": "image"})
        if content_format == "openai":
            content: Any = parts
            if role == "tool" and all(p["type"] == "text" for p in parts):
                content = "\n".join(texts)
        else:
            text = "\n".join(texts)
            placeholders = [image_placeholder] * message_images
            content = "\n".join(placeholders + ([text] if text else [])) if placeholders else text
        entry: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            calls = _tool_calls(message.get("tool_calls"), f"messages[{i}].tool_calls")
            if calls is not None:
                entry["tool_calls"] = calls
            if message.get("reasoning") is not None:
                entry["reasoning"] = entry["reasoning_content"] = message["reasoning"]
        elif role == "tool" and "tool_call_id" in message:
            entry["tool_call_id"] = message["tool_call_id"]
        if isinstance(message.get("name"), str):
            entry["name"] = message["name"]
        conversation.append(entry)
    return Conversation(conversation, images)


# Content format: a port of vLLM's _detect_content_format ----------------------------------------------------


def _is_var(node: jinja2.nodes.Node, name: str) -> bool:
    return isinstance(node, jinja2.nodes.Name) and node.ctx == "load" and node.name == name


def _is_attr(node: jinja2.nodes.Node, name: str, key: str) -> bool:
    if isinstance(node, jinja2.nodes.Getitem):
        return _is_var(node.node, name) and isinstance(node.arg, jinja2.nodes.Const) and node.arg.value == key
    if isinstance(node, jinja2.nodes.Getattr):
        return _is_var(node.node, name) and node.attr == key
    return False


def _is_var_or_elems(node: jinja2.nodes.Node, name: str, key: str | None = None) -> bool:
    if isinstance(node, jinja2.nodes.Filter):
        return node.node is not None and _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Test):
        return _is_var_or_elems(node.node, name, key)
    if isinstance(node, jinja2.nodes.Getitem) and isinstance(node.arg, jinja2.nodes.Slice):
        return _is_var_or_elems(node.node, name, key)
    return _is_attr(node, name, key) if key else _is_var(node, name)


def _names_bound_to(root: jinja2.nodes.Template, name: str) -> list[str]:
    names, queue = [name], deque([name])
    while queue:
        current = queue.popleft()
        for assign in root.find_all(jinja2.nodes.Assign):
            if _is_var_or_elems(assign.node, current) and isinstance(assign.target, jinja2.nodes.Name):
                names.append(assign.target.name)
                if assign.target.name != current:
                    queue.append(assign.target.name)
    return names


def _message_loop_vars(root: jinja2.nodes.Template) -> list[str]:
    sources = _names_bound_to(root, "messages")
    return [
        loop.target.name
        for loop in root.find_all(jinja2.nodes.For)
        if isinstance(loop.target, jinja2.nodes.Name) and any(_is_var_or_elems(loop.iter, n) for n in sources)
    ]


def _loops_over_content(root: jinja2.nodes.Template) -> bool:
    message_vars = _message_loop_vars(root)
    macro_params: dict[int, set[str]] = {}
    in_macros: set[int] = set()
    for macro in root.find_all(jinja2.nodes.Macro):
        names = {arg.name for arg in macro.args}
        params: set[str] = set()
        for call in root.find_all(jinja2.nodes.Call):
            if not (isinstance(call.node, jinja2.nodes.Name) and call.node.name == macro.name):
                continue
            for k, arg in enumerate(call.args):
                if k < len(macro.args) and any(_is_var_or_elems(arg, v, "content") for v in message_vars):
                    params.add(macro.args[k].name)
            for kwarg in call.kwargs:
                if kwarg.key in names and any(_is_var_or_elems(kwarg.value, v, "content") for v in message_vars):
                    params.add(kwarg.key)
        for loop in macro.find_all(jinja2.nodes.For):
            in_macros.add(id(loop))
            if params:
                macro_params[id(loop)] = params
    for loop in root.find_all(jinja2.nodes.For):
        if any(_is_var_or_elems(loop.iter, v, "content") for v in message_vars):
            return True
        if isinstance(loop.iter, jinja2.nodes.Name):
            if loop.iter.name in macro_params.get(id(loop), ()):
                return True
            if id(loop) not in in_macros and loop.iter.name == "content":
                return True
    return False


@lru_cache(maxsize=64)
def detect_content_format(template: str) -> str:
    """ "openai" if the template iterates over message content parts, else "string" (vLLM's rule)."""
    try:
        root = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        ).parse(template)
    except jinja2.TemplateSyntaxError:
        return "string"  # rendering reports the syntax error
    try:
        return "openai" if _loops_over_content(root) else "string"
    except Exception:  # noqa: BLE001 - vLLM falls back to its default on any AST surprise
        return "string"


# Rendering -----------------------------------------------------------------------------------------------


@lru_cache(maxsize=64)
def unsafe_access(template: str) -> str | None:
    """The first `__dunder__` attribute or item a template reads, if any.

    The sandbox already refuses calls through such attributes, but it renders a bare `{{ x.__class__ }}` as an
    empty string; refusing every such template up front gives the client one clear error instead.
    """
    try:
        root = jinja2.sandbox.ImmutableSandboxedEnvironment(extensions=["jinja2.ext.loopcontrols"]).parse(template)
    except jinja2.TemplateSyntaxError:
        return None  # rendering reports it
    for node in root.find_all((jinja2.nodes.Getattr, jinja2.nodes.Getitem)):
        name = node.attr if isinstance(node, jinja2.nodes.Getattr) else getattr(node.arg, "value", None)
        if isinstance(name, str) and name.startswith("__"):
            return name
    return None


@dataclass
class RenderedChat:
    prompt: str
    token_ids: list[int]
    image_sources: list[str]


def render_chat(
    tokenizer: Any,
    messages: list[dict[str, Any]],
    options: ChatOptions,
    template: str | None,
    image_placeholder: str,
    encode: Callable[[str, bool], list[int]],
) -> RenderedChat:
    """Render with the template (request > deployment > tokenizer's) and tokenize as vLLM's chat path does, without
    special tokens (`encode(text, add_special_tokens)`: preprocess/tokenize.py's TextEncoder.encode)."""
    template = options.chat_template or template or getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # a tokenizer with named templates: vLLM and transformers take "default"
        template = template.get("default")
    if not template:
        raise InvalidInput("messages: this model has no chat template; send text_input instead")
    if (name := unsafe_access(template)) is not None:
        raise InvalidInput(f"chat template: refused by the sandbox: it accesses the Python internal {name!r}")
    conversation = build_conversation(messages, detect_content_format(template), image_placeholder)
    if options.continue_final_message and conversation.messages[-1]["role"] != "assistant":
        raise InvalidInput("continue_final_message=true needs the last message to be an assistant message")
    try:
        # transformers compiles the template in jinja2's ImmutableSandboxedEnvironment: attribute access to
        # Python internals (__class__, __globals__, ...) and mutation of inputs raise SecurityError.
        prompt = tokenizer.apply_chat_template(
            conversation.messages,
            tools=options.tools,
            documents=options.documents,
            chat_template=template,
            add_generation_prompt=options.add_generation_prompt,
            continue_final_message=options.continue_final_message,
            tokenize=False,
            **options.chat_template_kwargs,
        )
    except jinja2.exceptions.SecurityError as exc:
        raise InvalidInput(f"chat template: refused by the sandbox: {exc}") from None
    except jinja2.TemplateError as exc:
        raise InvalidInput(f"chat template: {type(exc).__name__}: {exc}") from None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        # Templates reject input with raise_exception(...) (a TemplateError) or fail on unexpected shapes.
        raise InvalidInput(f"chat template failed: {type(exc).__name__}: {exc}") from None
    if not isinstance(prompt, str):
        raise InvalidInput("chat template: did not render to a string")
    return RenderedChat(prompt, encode(prompt, False), conversation.image_sources)
