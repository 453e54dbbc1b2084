"""Chat requests whose token ids and greedy outputs are compared with vLLM's own `LLM.chat` (run offline)."""

from __future__ import annotations

# A template that takes message content as a string (vLLM's "string" content format: text parts are joined
# with newlines), uses tools, documents, tool calls and a chat_template_kwargs switch (like Qwen3's thinking).
STRING_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTools: {{ tools | tojson }}<|im_end|>\n{% endif -%}"
    "{%- for doc in documents or [] %}<|im_start|>system\nDocument {{ doc.title }}: {{ doc.text }}<|im_end|>\n"
    "{% endfor -%}"
    "{%- for message in messages -%}"
    "<|im_start|>{{ message.role }}\n{{ message.content }}"
    "{%- if message.tool_calls %} calls {{ message.tool_calls | tojson }}{% endif -%}"
    "{%- if message.tool_call_id %} for {{ message.tool_call_id }}{% endif -%}"
    "<|im_end|>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n"
    "{%- if enable_thinking is defined and not enable_thinking %}<think></think>{% endif -%}"
    "{% endif -%}"
)

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
        },
    }
]

CHAT_CASES: list[dict] = [
    {  # the model's own template (ChatML, content parts), vLLM's defaults
        "messages": [
            {"role": "system", "content": "You are a terse assistant."},
            {"role": "user", "content": "Tell me about Triton and vLLM."},
        ],
        "options": {},
    },
    {  # multi-turn, content as a list of text parts, non-ASCII text
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "Grüße aus München"}, {"type": "text", "text": "!"}]},
            {"role": "assistant", "content": "你好，世界"},
            {"role": "user", "content": "Once upon a time, a small robot"},
        ],
        "options": {},
    },
    {  # continue the assistant's last message instead of opening a new one
        "messages": [
            {"role": "user", "content": "Write a story."},
            {"role": "assistant", "content": "Once upon a time"},
        ],
        "options": {"add_generation_prompt": False, "continue_final_message": True},
    },
    {  # a deployment/request template: string content, tools, documents, tool calls, a template switch
        "messages": [
            {"role": "system", "content": "Use tools."},
            {"role": "user", "content": [{"type": "text", "text": "Weather in"}, {"type": "text", "text": "Paris?"}]},
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "sunny, 21 C"}]},
        ],
        "options": {
            "chat_template": STRING_TEMPLATE,
            "chat_template_kwargs": {"enable_thinking": False},
            "tools": TOOLS,
            "documents": [{"title": "Paris", "text": "The capital of France."}],
        },
    },
    {  # the same template without its switch and without tools
        "messages": [{"role": "user", "content": "def handle(request):"}],
        "options": {"chat_template": STRING_TEMPLATE},
    },
]
