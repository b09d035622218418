//! Chat templates on minijinja against the text Python's jinja2 renders for the same template
//! and messages, set up as `transformers`' `apply_chat_template` sets it up (trim_blocks,
//! lstrip_blocks, loopcontrols, `tojson` as `json.dumps(ensure_ascii=False)`,
//! `raise_exception`). The expected strings were made with jinja2 3.1.6 and the `gguf` package
//! (reading the templates from the GGUF files), by the script in the module's `EXPECTED`
//! comment; Gemma 3's template is the one google/gemma-3 checkpoints ship in
//! `tokenizer_config.json` (the 270M GGUF file carries none).

mod common;

use common::models::{model_path, QWEN_1_5B, SMOLLM2};
use specdec::chat::{ChatMessage, ChatTemplate};
use specdec::{Error, ModelFiles, Result};

// How the expected strings were made (Python, `pip install jinja2 gguf`):
//   env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
//                                       extensions=[jinja2.ext.loopcontrols])
//   env.filters["tojson"] = lambda x, indent=None: json.dumps(x, ensure_ascii=False, indent=indent)
//   env.globals["raise_exception"] = <raises TemplateError>
//   env.from_string(template).render(messages=..., add_generation_prompt=True,
//                                    bos_token=..., eos_token=..., tools=...)

/// Gemma 3's chat template, as its checkpoints ship it.
const GEMMA3_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"#;

fn conversations() -> Vec<(&'static str, Vec<ChatMessage>)> {
    let m = ChatMessage::new;
    vec![
        ("one user turn", vec![m("user", "What is 2+2?")]),
        (
            "system and turns",
            vec![
                m("system", "You are terse."),
                m("user", "  Hi there  "),
                m("assistant", "Hello."),
                m("user", "List <b>two</b> colors & \"quote\"."),
            ],
        ),
        (
            "tool result",
            vec![
                m("user", "Read main.rs"),
                m("assistant", "Reading it."),
                m("tool", "fn main() {\n    println!(\"hi\");\n}"),
                m("user", "Thanks"),
            ],
        ),
    ]
}

fn tools() -> serde_json::Value {
    serde_json::json!([{"type": "function", "function": {"name": "read_file", "description": "Read a file <as text> & return it", "parameters": {"type": "object", "properties": {"path": {"type": "string"}, "lines": {"type": "integer"}}, "required": ["path"]}}}])
}

/// Each conversation's expected text (an error message where jinja2 raised), then the first
/// conversation's with the tools.
fn check(template: &ChatTemplate, expected: &[&str], tools_expected: &str) -> Result<()> {
    for ((name, messages), want) in conversations().iter().zip(expected) {
        match (template.render(messages, true), want.strip_prefix("ERROR: ")) {
            (Ok(got), None) => assert_eq!(&got, want, "{name}"),
            (Err(Error::Template(e)), Some(message)) => assert!(e.contains(message), "{name}: {e}"),
            (got, _) => panic!("{name}: {got:?}, expected {want:?}"),
        }
    }
    let got = template.render_with_tools(&conversations()[0].1, Some(&tools()), true)?;
    assert_eq!(got, tools_expected, "with tools");
    Ok(())
}

#[test]
fn qwen2_5_template_renders_as_jinja2_does() -> Result<()> {
    let Some(path) = model_path(QWEN_1_5B) else { return Ok(()) };
    let tok = ModelFiles::Gguf(path).tokenizer()?;
    let template = tok.chat_template().expect("the GGUF file has a template");
    let expected = [
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi there  <|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nList <b>two</b> colors & \"quote\".<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n<|im_start|>user\nRead main.rs<|im_end|>\n<|im_start|>assistant\nReading it.<|im_end|>\n<|im_start|>user\n<tool_response>\nfn main() {\n    println!(\"hi\");\n}\n</tool_response><|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n",
    ];
    check(template, &expected, "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"read_file\", \"description\": \"Read a file <as text> & return it\", \"parameters\": {\"type\": \"object\", \"properties\": {\"path\": {\"type\": \"string\"}, \"lines\": {\"type\": \"integer\"}}, \"required\": [\"path\"]}}}\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": <args-json-object>}}\n</tool_call><|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")?;
    // `chat` is the template's text (Qwen's encoder adds no start token).
    assert_eq!(tok.chat(&conversations()[0].1)?, expected[0]);
    assert_eq!(tok.chat_prompt("What is 2+2?"), expected[0]);
    Ok(())
}

#[test]
fn smollm2_template_renders_as_jinja2_does() -> Result<()> {
    let Some(path) = model_path(SMOLLM2) else { return Ok(()) };
    let tok = ModelFiles::Gguf(path).tokenizer()?;
    let template = tok.chat_template().expect("the GGUF file has a template");
    check(template, &[
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\n  Hi there  <|im_end|>\n<|im_start|>assistant\nHello.<|im_end|>\n<|im_start|>user\nList <b>two</b> colors & \"quote\".<|im_end|>\n<|im_start|>assistant\n",
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nRead main.rs<|im_end|>\n<|im_start|>assistant\nReading it.<|im_end|>\n<|im_start|>tool\nfn main() {\n    println!(\"hi\");\n}<|im_end|>\n<|im_start|>user\nThanks<|im_end|>\n<|im_start|>assistant\n",
    ], "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n")
}

#[test]
fn gemma3_template_renders_as_jinja2_does() -> Result<()> {
    let template = ChatTemplate::new(GEMMA3_TEMPLATE, "<bos>", "<eos>");
    check(&template, &[
        "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
        "<bos><start_of_turn>user\nYou are terse.\n\nHi there<end_of_turn>\n<start_of_turn>model\nHello.<end_of_turn>\n<start_of_turn>user\nList <b>two</b> colors & \"quote\".<end_of_turn>\n<start_of_turn>model\n",
        "ERROR: Conversation roles must alternate user/assistant/user/assistant/...",
    ], "<bos><start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n")
}

#[test]
fn a_template_that_does_not_parse_is_a_typed_error() {
    let bad = ChatTemplate::new("{% for m in messages %}{{ m.content }", "", "");
    assert!(matches!(bad.render(&[ChatMessage::new("user", "hi")], true), Err(Error::Template(_))));
}
