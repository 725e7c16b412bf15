//! The Content-Type sent with an upload, as `aws s3 cp`, `gcloud storage cp` and rclone send
//! one: guessed from the key's extension (`mime_guess`'s table, the same for every upload
//! path), set to one value for every upload, or not sent (the store then answers
//! `application/octet-stream` on S3 and GCS). An extension the table does not know sends
//! none.

/// What Content-Type an upload carries; see the module doc.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ContentType {
    /// From the key's extension (`index.html` -> `text/html`).
    #[default]
    Guess,
    /// This value for every upload.
    Fixed(String),
    /// None.
    Off,
}

impl ContentType {
    /// The Content-Type for an upload to `key`, if any.
    pub fn for_key(&self, key: &str) -> Option<String> {
        match self {
            Self::Guess => mime_guess::from_path(key.rsplit('/').next().unwrap_or(key)).first_raw().map(str::to_string),
            Self::Fixed(v) => Some(v.clone()),
            Self::Off => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn guesses_from_the_extension() {
        let g = ContentType::Guess;
        assert_eq!(g.for_key("site/index.html").as_deref(), Some("text/html"));
        assert_eq!(g.for_key("data/x.json").as_deref(), Some("application/json"));
        assert_eq!(g.for_key("a/photo.JPG").as_deref(), Some("image/jpeg"));
        assert_eq!(g.for_key("a.b/README"), None);
        assert_eq!(g.for_key("x.unknownext"), None);
        assert_eq!(ContentType::Fixed("text/plain".into()).for_key("a.json").as_deref(), Some("text/plain"));
        assert_eq!(ContentType::Off.for_key("a.json"), None);
    }
}
