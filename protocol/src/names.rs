//! Enums whose JSON names (the HTTP API, `--json`) are lowercase while the
//! wire (bincode, MessagePack) carries them as it always has.

/// Implements `Serialize` and `Deserialize` for a unit-variant enum: in a
/// human-readable format (JSON) each variant as its lowercase name (the
/// capitalised one, `$old`, still read), on the wire as the variant itself, so a
/// peer of an older version reads it unchanged.
#[macro_export]
macro_rules! json_lowercase {
    ($ty:ident { $($variant:ident = $name:literal | $old:literal),+ $(,)? }) => {
        impl serde::Serialize for $ty {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                #[derive(serde::Serialize)]
                enum Wire { $($variant),+ }
                match (s.is_human_readable(), self) {
                    $((true, $ty::$variant) => s.serialize_str($name),)+
                    $((false, $ty::$variant) => Wire::$variant.serialize(s),)+
                }
            }
        }
        impl<'de> serde::Deserialize<'de> for $ty {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                #[derive(serde::Deserialize)]
                enum Wire { $($variant),+ }
                #[derive(serde::Deserialize)]
                enum Text { $(#[serde(rename = $name, alias = $old)] $variant),+ }
                Ok(if d.is_human_readable() {
                    match Text::deserialize(d)? { $(Text::$variant => $ty::$variant),+ }
                } else {
                    match Wire::deserialize(d)? { $(Wire::$variant => $ty::$variant),+ }
                })
            }
        }
    };
}
