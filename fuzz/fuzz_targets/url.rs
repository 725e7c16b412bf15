//! Store URL parsing (crates/store/src/location.rs), on arbitrary strings.
//!
//! Properties: never panics; an error is one line that names the problem; a URL that
//! parses is the store its scheme names (in any case) and prints (`to_url`) as a URL that
//! parses back to the same location.
#![no_main]

use bucketfs_store::location::Location;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|s: &str| {
    match Location::parse(s) {
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            assert!(!msg.contains('\n') && !msg.contains('\r'), "multi-line error: {msg:?}");
        }
        Ok(loc) => {
            // The scheme, in any case, decides the store.
            let scheme = s.split_once("://").map(|(sc, _)| sc.to_ascii_lowercase()).unwrap_or_default();
            let want = match scheme.as_str() {
                "s3" => matches!(loc, Location::S3 { .. }),
                "gs" | "gcs" => matches!(loc, Location::Gcs { .. }),
                "file" => matches!(loc, Location::File { .. }),
                _ => matches!(loc, Location::Memory),
            };
            assert!(want, "{s:?} parsed as {loc:?}");
            let again = Location::parse(&loc.to_url())
                .unwrap_or_else(|e| panic!("{s:?} parsed, but its to_url {:?} does not: {e}", loc.to_url()));
            assert_eq!(again, loc, "{s:?} -> {:?}", loc.to_url());
        }
    }
});
