//! `outputSchema`: acpd asks the child for JSON and checks the final output against the schema
//! itself. Schemas are compiled without any retriever for remote or file references (the
//! `jsonschema` crate is built without them); a `$ref` that leaves the document is refused up
//! front with a clear error.

use acpd_protocol::acp::{ContentBlock, TextContent};
use serde_json::{Value, json};

use super::RegistryError;

pub(super) struct OutputSchema {
    validator: jsonschema::Validator,
    text: String,
}

impl OutputSchema {
    pub(super) fn compile(schema: &Value) -> Result<OutputSchema, RegistryError> {
        let unsupported = |reason: String| RegistryError::UnsupportedSchema { reason };
        if !schema.is_object() {
            return Err(unsupported("the schema must be a JSON object".into()));
        }
        if let Some(r) = non_local_ref(schema) {
            return Err(unsupported(format!(
                "$ref \"{r}\" points outside the schema; only local references (\"#…\") are resolved"
            )));
        }
        let validator = jsonschema::validator_for(schema)
            .map_err(|e| unsupported(format!("not a valid JSON Schema: {e}")))?;
        Ok(OutputSchema {
            validator,
            text: schema.to_string(),
        })
    }

    /// The instruction appended to every prompt of the run, marked as acpd's own.
    pub(super) fn instruction(&self) -> ContentBlock {
        let text = format!(
            "\n\nReply with only one JSON value, with no prose and no code fence, that validates \
             against this JSON Schema:\n{}",
            self.text
        );
        let mut meta = serde_json::Map::new();
        meta.insert("acpd".into(), json!({ "instruction": true }));
        ContentBlock::Text(TextContent::new(text).meta(meta))
    }

    /// The structured value, or why the output does not qualify.
    pub(super) fn check(&self, output: &str) -> Result<Value, String> {
        let body = strip_fence(output.trim());
        let value: Value =
            serde_json::from_str(body).map_err(|e| format!("the output is not JSON ({e})"))?;
        let errors: Vec<String> = self
            .validator
            .iter_errors(&value)
            .take(5)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        if errors.is_empty() {
            Ok(value)
        } else {
            Err(format!(
                "the output does not validate against the outputSchema: {}",
                errors.join("; ")
            ))
        }
    }
}

/// Tolerates a Markdown code fence around the JSON, which models add despite being asked not to.
fn strip_fence(text: &str) -> &str {
    let Some(rest) = text.strip_prefix("```") else {
        return text;
    };
    let rest = rest.split_once('\n').map_or("", |(_, body)| body);
    rest.strip_suffix("```").unwrap_or(rest).trim()
}

fn non_local_ref(schema: &Value) -> Option<String> {
    match schema {
        Value::Object(map) => {
            if let Some(Value::String(r)) = map.get("$ref")
                && !r.starts_with('#')
            {
                return Some(r.clone());
            }
            map.values().find_map(non_local_ref)
        }
        Value::Array(items) => items.iter().find_map(non_local_ref),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn schema() -> Value {
        json!({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})
    }

    #[test]
    fn valid_output_becomes_structured() {
        let s = OutputSchema::compile(&schema()).unwrap();
        assert_eq!(s.check(" {\"n\": 3} ").unwrap(), json!({"n": 3}));
        assert_eq!(
            s.check("```json\n{\"n\": 4}\n```").unwrap(),
            json!({"n": 4})
        );
    }

    #[test]
    fn invalid_output_says_why() {
        let s = OutputSchema::compile(&schema()).unwrap();
        assert!(s.check("hello").unwrap_err().contains("not JSON"));
        assert!(
            s.check("{\"n\": \"x\"}")
                .unwrap_err()
                .contains("does not validate")
        );
    }

    #[test]
    fn remote_and_file_refs_are_refused() {
        for r in [
            "https://example.com/s.json",
            "file:///etc/passwd",
            "other.json#/a",
        ] {
            let e = OutputSchema::compile(&json!({"properties": {"a": {"$ref": r}}}))
                .err()
                .unwrap();
            assert!(e.to_string().contains("points outside"), "{e}");
        }
        let local = json!({"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}});
        assert!(OutputSchema::compile(&local).is_ok());
        assert!(OutputSchema::compile(&json!({"type": 12})).is_err());
    }
}
