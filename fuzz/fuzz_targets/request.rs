//! Request parsing never panics, and every refusal is a client error (`invalid` or
//! `too_large`), never an internal one: request bodies of every route, query strings,
//! base64, and the HTTP head and its framing.
#![no_main]
use gitterm_agent::api::request;
use gitterm_agent::http;;
use gitterm_agent::model::error::Error;
use libfuzzer_sys::fuzz_target;

fn client_error<T>(r: Result<T, Error>) {
    if let Err(e) = r {
        assert!(matches!(e, Error::Invalid(_) | Error::TooLarge(_)), "{e:?}");
    }
}

fuzz_target!(|data: &[u8]| {
    client_error(request::start_body(data, None));
    client_error(request::start_body(data, Some("key")));
    client_error(request::env_body(data));
    client_error(request::preview_body(data, None));
    client_error(request::no_body(data));
    client_error(request::mkdir_body(data));
    client_error(request::move_body(data));
    if let Ok(s) = std::str::from_utf8(data) {
        client_error(request::Query::parse(s, &["offset", "limit", "waitSeconds"]));
        let _ = request::percent_decode(s);
        client_error(request::file_mode(s));
        client_error(request::Query::parse(s, &["path", "mode", "createDirs", "overwrite"]));
        let _ = request::base64_decode(s);
    }
    if let Ok(head) = http::parse_head(data, 100) {
        let _ = http::framing(&head, 8 << 20);
    }
});
