//! Fitting a parent's `session/prompt` to what the child agent accepts.
//!
//! acpd advertises the prompt capabilities of the agent it bridges to, but a parent may still
//! send blocks that agent never announced (a client that ignores capabilities, or a session
//! moved to another provider). ACP makes `text` and `resource_link` baseline; `image`, `audio`
//! and embedded `resource` blocks each need their capability. An embedded resource loses
//! nothing essential as a link (the agent can read the uri itself), so it is converted; an
//! image or audio block has no such stand-in, so the prompt is refused and the parent is told
//! which capability is missing.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

/// The `promptCapabilities` of an agent. `Default` is ACP's baseline: none of them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptCaps {
    pub image: bool,
    pub audio: bool,
    pub embedded_context: bool,
}

impl PromptCaps {
    /// Reads `/promptCapabilities/{image,audio,embeddedContext}` of an `agentCapabilities`
    /// object; anything absent or not `true` counts as not supported, as ACP says.
    pub fn from_agent_capabilities(caps: &Value) -> PromptCaps {
        let flag = |name: &str| {
            caps.pointer(&format!("/promptCapabilities/{name}"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        PromptCaps {
            image: flag("image"),
            audio: flag("audio"),
            embedded_context: flag("embeddedContext"),
        }
    }

    fn all(self) -> bool {
        self.image && self.audio && self.embedded_context
    }
}

/// What [`fit_prompt`] made of a prompt.
#[derive(Debug)]
pub enum Fitted {
    /// Forward the original bytes.
    Unchanged,
    /// Forward these params instead (embedded resources turned into links).
    Converted(Box<RawValue>),
}

/// A `session/prompt` params object checked against what the agent accepts: an embedded
/// `resource` becomes a `resource_link` (uri, name = last path segment or the uri, mimeType
/// kept) when embeddedContext is false; an `image`/`audio` block the agent did not advertise
/// is refused naming the capability (e.g. "promptCapabilities.image"). `Err` is a message for
/// a -32602 answer to the parent.
///
/// Cheap when nothing needs changing: with every capability true it returns `Unchanged` at
/// once (the agent validates the prompt itself); otherwise only the block types are read,
/// borrowed, and the params are parsed in full only when a resource must be converted.
pub fn fit_prompt(params: &RawValue, caps: PromptCaps) -> Result<Fitted, String> {
    if caps.all() {
        return Ok(Fitted::Unchanged);
    }
    #[derive(Deserialize)]
    struct Prompt<'a> {
        #[serde(borrow)]
        prompt: Vec<&'a RawValue>,
    }
    #[derive(Deserialize)]
    struct Block<'a> {
        #[serde(rename = "type", borrow)]
        kind: Cow<'a, str>,
    }
    // The derived deserialisers would also read an array by position (`[["image"]]`).
    let is_object = |raw: &RawValue| raw.get().trim_start().starts_with('{');
    let shape = "session/prompt params need a `prompt` array of content blocks";
    if !is_object(params) {
        return Err(shape.into());
    }
    let prompt: Prompt<'_> = serde_json::from_str(params.get()).map_err(|_| shape)?;
    let mut convert = false;
    for (i, raw) in prompt.prompt.iter().enumerate() {
        let block = is_object(raw)
            .then(|| serde_json::from_str::<Block<'_>>(raw.get()).ok())
            .flatten()
            .ok_or_else(|| {
                format!("prompt[{i}] is not a content block (an object with a `type`)")
            })?;
        match block.kind.as_ref() {
            "image" if !caps.image => return Err(refusal("image")),
            "audio" if !caps.audio => return Err(refusal("audio")),
            "resource" if !caps.embedded_context => convert = true,
            _ => {}
        }
    }
    if !convert {
        return Ok(Fitted::Unchanged);
    }
    let mut params: Map<String, Value> = serde_json::from_str(params.get()).map_err(|_| shape)?;
    let Some(Value::Array(blocks)) = params.get_mut("prompt") else {
        return Err(shape.into());
    };
    for (i, block) in blocks.iter_mut().enumerate() {
        if block.get("type").and_then(Value::as_str) == Some("resource") {
            *block = resource_link(block, i)?;
        }
    }
    let text = serde_json::to_string(&params).map_err(|e| e.to_string())?;
    RawValue::from_string(text)
        .map(Fitted::Converted)
        .map_err(|e| e.to_string())
}

/// `kind` is both the block type and its capability's name (`image`, `audio`).
fn refusal(kind: &str) -> String {
    format!(
        "the agent does not accept {kind} content (promptCapabilities.{kind} is false); \
         send it as a resource_link or text instead"
    )
}

/// The `resource_link` standing in for the embedded `resource` block `block` (prompt[`i`]).
/// Its text or blob is dropped: the link names where the agent can read it.
fn resource_link(block: &Value, i: usize) -> Result<Value, String> {
    let resource = block.get("resource");
    let Some(uri) = resource.and_then(|r| r.get("uri")).and_then(Value::as_str) else {
        return Err(format!(
            "prompt[{i}] embeds a resource without a `resource.uri`; the agent does not accept \
             embedded context (promptCapabilities.embeddedContext is false), so acpd can only \
             pass it as a resource_link, which needs the uri"
        ));
    };
    let mut link = Map::new();
    link.insert("type".into(), "resource_link".into());
    link.insert("uri".into(), uri.into());
    link.insert("name".into(), link_name(uri).into());
    if let Some(mime) = resource
        .and_then(|r| r.get("mimeType"))
        .filter(|m| m.is_string())
    {
        link.insert("mimeType".into(), mime.clone());
    }
    // Both are defined on the block itself for either type, so they carry over unchanged.
    for key in ["annotations", "_meta"] {
        if let Some(value) = block.get(key) {
            link.insert(key.into(), value.clone());
        }
    }
    Ok(Value::Object(link))
}

/// The last non-empty segment of `uri`'s path (query and fragment ignored, the authority never
/// counts as a segment), else the uri itself: `file:///src/main.rs` → `main.rs`.
fn link_name(uri: &str) -> &str {
    let path = uri.split(['?', '#']).next().unwrap_or(uri);
    let path = match path.split_once("://") {
        Some((_, rest)) => rest.find('/').map_or("", |slash| &rest[slash..]),
        None => path,
    };
    path.rsplit('/').find(|s| !s.is_empty()).unwrap_or(uri)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    const NONE: PromptCaps = PromptCaps {
        image: false,
        audio: false,
        embedded_context: false,
    };

    fn raw(v: Value) -> Box<RawValue> {
        RawValue::from_string(v.to_string()).unwrap()
    }

    fn fit(v: Value, caps: PromptCaps) -> Result<Option<Value>, String> {
        fit_prompt(&raw(v), caps).map(|f| match f {
            Fitted::Unchanged => None,
            Fitted::Converted(p) => Some(serde_json::from_str(p.get()).unwrap()),
        })
    }

    fn prompt(blocks: Value) -> Value {
        json!({"sessionId": "s1", "prompt": blocks, "_meta": {"k": 1}})
    }

    #[test]
    fn caps_are_read_from_agent_capabilities() {
        let caps = PromptCaps::from_agent_capabilities(&json!({
            "loadSession": true,
            "promptCapabilities": {"image": true, "audio": "yes", "embeddedContext": true}
        }));
        assert_eq!(
            caps,
            PromptCaps {
                image: true,
                audio: false,
                embedded_context: true
            }
        );
        assert_eq!(PromptCaps::from_agent_capabilities(&json!({})), NONE);
        assert_eq!(PromptCaps::from_agent_capabilities(&json!(null)), NONE);
    }

    #[test]
    fn baseline_blocks_pass_unchanged() {
        let p = prompt(json!([
            {"type": "text", "text": "hi"},
            {"type": "resource_link", "uri": "file:///a.rs", "name": "a.rs"},
            {"type": "something_new", "x": 1}
        ]));
        assert_eq!(fit(p, NONE), Ok(None));
    }

    #[test]
    fn all_caps_return_unchanged_without_looking() {
        let all = PromptCaps {
            image: true,
            audio: true,
            embedded_context: true,
        };
        // Even malformed params: the agent, which accepts everything, judges them.
        assert_eq!(fit(json!({"prompt": "not an array"}), all), Ok(None));
        let p = prompt(json!([{"type": "image", "data": "AA==", "mimeType": "image/png"}]));
        assert_eq!(fit(p, all), Ok(None));
    }

    #[test]
    fn unadvertised_image_and_audio_are_refused_by_capability() {
        let image = prompt(json!([{"type": "image", "data": "AA==", "mimeType": "image/png"}]));
        let err = fit(image.clone(), NONE).unwrap_err();
        assert!(err.contains("promptCapabilities.image"), "{err}");
        let caps = PromptCaps {
            image: true,
            ..NONE
        };
        assert_eq!(fit(image, caps), Ok(None));

        let audio = prompt(json!([{"type": "audio", "data": "AA==", "mimeType": "audio/wav"}]));
        let err = fit(audio, caps).unwrap_err();
        assert!(err.contains("promptCapabilities.audio"), "{err}");
    }

    #[test]
    fn refusal_wins_over_conversion() {
        let p = prompt(json!([
            {"type": "resource", "resource": {"uri": "file:///a", "text": "x"}},
            {"type": "image", "data": "AA==", "mimeType": "image/png"}
        ]));
        assert!(
            fit(p, NONE)
                .unwrap_err()
                .contains("promptCapabilities.image")
        );
    }

    #[test]
    fn embedded_text_resource_becomes_a_link() {
        let p = prompt(json!([
            {"type": "text", "text": "look"},
            {"type": "resource", "annotations": {"priority": 1},
             "resource": {"uri": "file:///home/u/src/main.rs", "mimeType": "text/x-rust",
                          "text": "fn main() {}"}}
        ]));
        let out = fit(p, NONE).unwrap().unwrap();
        assert_eq!(
            out,
            json!({"sessionId": "s1", "_meta": {"k": 1}, "prompt": [
                {"type": "text", "text": "look"},
                {"type": "resource_link", "uri": "file:///home/u/src/main.rs",
                 "name": "main.rs", "mimeType": "text/x-rust", "annotations": {"priority": 1}}
            ]})
        );
    }

    #[test]
    fn embedded_blob_resource_becomes_a_link_too() {
        let p = prompt(json!([{"type": "resource",
            "resource": {"uri": "https://example.com/img/logo.png?v=2#top", "blob": "iVBORw=="}}]));
        let out = fit(p, NONE).unwrap().unwrap();
        assert_eq!(
            out["prompt"],
            json!([{"type": "resource_link", "uri": "https://example.com/img/logo.png?v=2#top",
                    "name": "logo.png"}])
        );
    }

    #[test]
    fn embedded_resource_passes_when_advertised() {
        let caps = PromptCaps {
            embedded_context: true,
            ..NONE
        };
        let p =
            prompt(json!([{"type": "resource", "resource": {"uri": "file:///a", "text": "x"}}]));
        assert_eq!(fit(p, caps), Ok(None));
    }

    #[test]
    fn resource_without_uri_is_refused_with_a_reason() {
        for resource in [
            json!({"text": "x"}),
            json!({"uri": 7, "blob": "AA=="}),
            json!(null),
        ] {
            let p = prompt(json!([{"type": "resource", "resource": resource}]));
            let err = fit(p, NONE).unwrap_err();
            assert!(
                err.contains("prompt[0]") && err.contains("resource.uri"),
                "{err}"
            );
            assert!(err.contains("promptCapabilities.embeddedContext"), "{err}");
        }
        let p = prompt(json!([{"type": "resource"}]));
        assert!(fit(p, NONE).unwrap_err().contains("resource.uri"));
    }

    #[test]
    fn malformed_prompts_are_err() {
        for params in [
            json!({"sessionId": "s", "prompt": "hello"}),
            json!({"sessionId": "s", "prompt": {"type": "text"}}),
            json!({"sessionId": "s"}),
            json!([[{"type": "image"}]]),
            json!("prompt"),
            json!(null),
        ] {
            let err = fit(params.clone(), NONE).unwrap_err();
            assert!(err.contains("`prompt` array"), "{params}: {err}");
        }
        for block in [
            json!(3),
            json!(["image"]),
            json!({"text": "no type"}),
            json!({"type": 1}),
        ] {
            let err = fit(prompt(json!([block.clone()])), NONE).unwrap_err();
            assert!(
                err.contains("prompt[0] is not a content block"),
                "{block}: {err}"
            );
        }
    }

    #[test]
    fn escaped_type_is_still_recognised() {
        let raw = RawValue::from_string(
            r#"{"prompt":[{"type":"im\u0061ge","data":"AA==","mimeType":"image/png"}]}"#.into(),
        )
        .unwrap();
        assert!(fit_prompt(&raw, NONE).is_err());
    }

    #[test]
    fn link_names() {
        assert_eq!(link_name("file:///home/u/src/main.rs"), "main.rs");
        assert_eq!(link_name("file:///home/u/src/"), "src");
        assert_eq!(link_name("https://example.com"), "https://example.com");
        assert_eq!(link_name("https://example.com/"), "https://example.com/");
        assert_eq!(link_name("https://example.com/a/b?x=/y"), "b");
        assert_eq!(link_name("untitled:Untitled-1"), "untitled:Untitled-1");
        assert_eq!(link_name("zed:///agent/thread/42#frag"), "42");
        assert_eq!(link_name(""), "");
    }
}
