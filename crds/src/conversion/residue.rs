//! What one version holds that the other cannot: the difference between an object and the
//! object its conversion converts back to, kept as a list of guarded field replacements.
//!
//! An entry says "at `path` the converted-back object has `was`; the original had `value`"
//! (either may be absent). Restoring replaces the field only where the object still has
//! `was`: a field changed since, through the other version, keeps the change, so an edit
//! is never undone by an older copy. Lists are compared whole.

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};

/// The fields of an object its counterpart in the other version cannot express.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub(crate) struct Residue(Vec<Entry>);

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    /// JSON pointer (RFC 6901) of the field.
    path: String,
    /// The original value; absent: the original had no such field.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    value: Option<Value>,
    /// What converting back gives; absent: no such field.
    #[serde(
        default,
        deserialize_with = "present",
        skip_serializing_if = "Option::is_none"
    )]
    was: Option<Value>,
}

/// A field that is present, even as `null` (plain `Option` reads `null` as absent).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Value>, D::Error> {
    Value::deserialize(d).map(Some)
}

impl Residue {
    /// The entries that turn `converted_back` into `original`, in path order.
    pub(crate) fn between(
        converted_back: &Map<String, Value>,
        original: &Map<String, Value>,
    ) -> Self {
        let mut entries = Vec::new();
        diff(converted_back, original, "", &mut entries);
        Self(entries)
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Puts the original values back where `object` still holds what conversion gave.
    pub(crate) fn restore(&self, object: &mut Map<String, Value>) {
        for entry in &self.0 {
            let mut segments: Vec<String> = entry.path.split('/').skip(1).map(unescape).collect();
            let Some(key) = segments.pop() else { continue };
            let Some(parent) = segments.iter().try_fold(&mut *object, |map, segment| {
                map.get_mut(segment)?.as_object_mut()
            }) else {
                continue;
            };
            if parent.get(&key) != entry.was.as_ref() {
                continue;
            }
            match &entry.value {
                Some(value) => {
                    parent.insert(key, value.clone());
                }
                None => {
                    parent.remove(&key);
                }
            }
        }
    }
}

fn diff(
    back: &Map<String, Value>,
    original: &Map<String, Value>,
    path: &str,
    out: &mut Vec<Entry>,
) {
    let mut keys: Vec<&String> = back.keys().chain(original.keys()).collect();
    keys.sort();
    keys.dedup();
    for key in keys {
        let path = format!("{path}/{}", escape(key));
        match (back.get(key), original.get(key)) {
            (Some(b), Some(o)) if b == o => {}
            (Some(Value::Object(b)), Some(Value::Object(o))) => diff(b, o, &path, out),
            (was, value) => out.push(Entry {
                path,
                value: value.cloned(),
                was: was.cloned(),
            }),
        }
    }
}

fn escape(segment: &str) -> String {
    segment.replace('~', "~0").replace('/', "~1")
}

fn unescape(segment: &str) -> String {
    segment.replace("~1", "/").replace("~0", "~")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn map(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn restores_the_original_including_nulls_and_odd_keys() {
        let back = map(json!({"a": {"x": 1, "y": [1, 2]}, "b": 2, "c/~d": 3}));
        let original = map(json!({"a": {"x": 1, "y": [2, 1], "z": null}, "c/~d": 4, "e": {}}));
        let residue = Residue::between(&back, &original);
        let text = serde_json::to_string(&residue).unwrap();
        let read: Residue = serde_json::from_str(&text).unwrap();
        assert_eq!(read, residue);
        let mut restored = back.clone();
        read.restore(&mut restored);
        assert_eq!(restored, original);
        assert!(text.contains(r#""path":"/c~1~0d""#), "{text}");
    }

    #[test]
    fn a_field_changed_since_keeps_its_change() {
        let back = map(json!({"s": {"image": "a", "env": [1]}}));
        let original = map(json!({"s": {"image": "a", "env": [2], "extra": true}}));
        let residue = Residue::between(&back, &original);
        // The other version changed `env` and removed `s` of another object.
        let mut edited = map(json!({"s": {"image": "b", "env": [3]}}));
        residue.restore(&mut edited);
        assert_eq!(
            edited,
            map(json!({"s": {"image": "b", "env": [3], "extra": true}}))
        );
        let mut gone = map(json!({}));
        residue.restore(&mut gone);
        assert_eq!(gone, map(json!({})));
    }

    #[test]
    fn equal_objects_leave_nothing() {
        let object = map(json!({"a": {"b": [1]}}));
        assert!(Residue::between(&object, &object).is_empty());
    }
}
