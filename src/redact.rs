//! Keeping secrets out of the server log without hiding what anyone did.
//!
//! On a reload PostgreSQL's postmaster logs every changed setting with its new value
//! (`parameter "outbox.signing_secret" changed to "…"`). A log hook, installed in the
//! postmaster and so in every process it forks, replaces those lines for the two settings that
//! may hold secrets: 0.1.0's signing secret, and the webhook URL (credentials live in its user
//! and password).
//!
//! The database generates endpoint secrets and returns them once, so by default no statement
//! carries one. A caller may still supply one (`outbox_endpoint_rotate_secret(name, 'whsec_…')`)
//! or put credentials in a URL. The same hook masks exactly those literals wherever a log line
//! quotes them (the statement line of `log_statement`, bound parameters, an error's detail,
//! context and `STATEMENT:` line, an audit extension's line): `whsec_***` and `https://***@host`.
//! Everything else on the line stays, so no one can keep their statements out of the log by
//! mentioning a secret, and the hook keeps no state that a rolled-back savepoint could leave
//! behind.

use std::ffi::{c_char, CStr, CString};
use std::sync::atomic::{AtomicPtr, Ordering};

use pgrx::prelude::*;

/// The untranslated message PostgreSQL logs for a changed setting.
const SETTING_CHANGED: &str = "parameter \"%s\" changed to \"%s\"";
/// The settings whose values never reach the log.
const SECRET_SETTINGS: &[&str] = &["outbox.signing_secret", "outbox.webhook_url"];
/// How every signing secret begins (sql/endpoints.sql accepts no other).
const SECRET_PREFIX: &[u8] = b"whsec_";
const MASK: &[u8] = b"***";

static mut PREVIOUS_HOOK: pg_sys::emit_log_hook_type = None;

/// The masked copy of the running statement that `debug_query_string` points to, if any: kept
/// in TopMemoryContext until the next one replaces it, since PostgreSQL may print the statement
/// again after this report (a later line of the same statement, or its error's `STATEMENT:`).
static MASKED_STATEMENT: AtomicPtr<c_char> = AtomicPtr::new(std::ptr::null_mut());

/// Called from `_PG_init` in the postmaster, while shared_preload_libraries is processed.
pub fn install_log_hook() {
    // SAFETY: the postmaster is single-threaded while it loads preloaded libraries; the hook
    // chain is saved and called, as PostgreSQL's own modules do.
    unsafe {
        PREVIOUS_HOOK = pg_sys::emit_log_hook;
        pg_sys::emit_log_hook = Some(mask_secrets_in_report);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn mask_secrets_in_report(edata: *mut pg_sys::ErrorData) {
    // SAFETY: PostgreSQL passes the report being emitted; its strings are NUL-terminated and
    // live in the report's memory context, the current one, where pstrdup puts the new ones.
    // debug_query_string is null or the running statement's NUL-terminated text. Nothing below
    // can panic (in the postmaster that would stop the server).
    unsafe {
        let data = &mut *edata;
        if !data.message_id.is_null() && !data.message.is_null() {
            let id = CStr::from_ptr(data.message_id).to_bytes();
            let message = CStr::from_ptr(data.message).to_bytes();
            if let Some(replacement) = hidden_setting_change(id, message) {
                data.message = pg_sys::pstrdup(replacement.as_ptr());
            }
        }
        for field in [&mut data.message, &mut data.detail, &mut data.detail_log, &mut data.context, &mut data.internalquery] {
            if let Some(masked) = masked_copy(*field) {
                *field = pg_sys::pstrdup(masked.as_ptr());
            }
        }
        if let Some(masked) = masked_copy(pg_sys::debug_query_string) {
            let copy = pg_sys::MemoryContextStrdup(pg_sys::TopMemoryContext, masked.as_ptr());
            pg_sys::debug_query_string = copy;
            // The previous copy held no secret, so it is not the statement just replaced.
            let previous = MASKED_STATEMENT.swap(copy, Ordering::Relaxed);
            if !previous.is_null() {
                pg_sys::pfree(previous.cast());
            }
        }
        if let Some(previous) = PREVIOUS_HOOK {
            previous(edata);
        }
    }
}

/// `text` with its secrets masked, or `None` when it holds none (or is null).
///
/// # Safety
/// `text` is null or a NUL-terminated string.
unsafe fn masked_copy(text: *const c_char) -> Option<CString> {
    if text.is_null() {
        return None;
    }
    // SAFETY: as the caller promises.
    let masked = mask_secrets(unsafe { CStr::from_ptr(text) }.to_bytes())?;
    // A masked C string gains no NUL byte.
    CString::new(masked).ok()
}

/// What to log instead of a changed secret setting's line, whatever language the server
/// logs in (the check uses the untranslated message and the setting's name, which is never
/// translated); `None` for every other line.
pub fn hidden_setting_change(message_id: &[u8], message: &[u8]) -> Option<&'static CStr> {
    if message_id != SETTING_CHANGED.as_bytes() {
        return None;
    }
    let names = [
        (SECRET_SETTINGS[0], c"parameter \"outbox.signing_secret\" changed (value hidden)"),
        (SECRET_SETTINGS[1], c"parameter \"outbox.webhook_url\" changed (value hidden: a URL may carry credentials)"),
    ];
    names.into_iter().find(|(name, _)| contains(message, format!("\"{name}\"").as_bytes())).map(|(_, line)| line)
}

/// `text` with every signing secret (`whsec_` and its base64) and every URL's user and
/// password (between `://` and the `@` before the host) replaced by `***`; `None` when there
/// is nothing to mask. Masking what is already masked changes nothing.
pub fn mask_secrets(text: &[u8]) -> Option<Vec<u8>> {
    let mut masked = Vec::with_capacity(text.len());
    let mut at = 0;
    while at < text.len() {
        if text[at..].starts_with(SECRET_PREFIX) {
            let secret = text[at + SECRET_PREFIX.len()..].iter().take_while(|&&b| is_base64(b)).count();
            masked.extend_from_slice(SECRET_PREFIX);
            if secret > 0 {
                masked.extend_from_slice(MASK);
            }
            at += SECRET_PREFIX.len() + secret;
        } else if text[at..].starts_with(b"://") {
            let authority = &text[at + 3..];
            let end = authority.iter().position(|&b| ends_authority(b)).unwrap_or(authority.len());
            masked.extend_from_slice(b"://");
            at += 3;
            if let Some(userinfo) = authority[..end].iter().rposition(|&b| b == b'@') {
                masked.extend_from_slice(MASK);
                at += userinfo;
            }
        } else {
            masked.push(text[at]);
            at += 1;
        }
    }
    (masked != text).then_some(masked)
}

fn is_base64(byte: u8) -> bool {
    byte.is_ascii_alphanumeric() || matches!(byte, b'+' | b'/' | b'=')
}

/// Where a URL's authority (user, password, host, port) ends: at its path, query or fragment,
/// or where the text around it resumes (a quote, a space, a bracket of the statement).
fn ends_authority(byte: u8) -> bool {
    matches!(byte, b'/' | b'?' | b'#' | b'\'' | b'"' | b'\\' | b'(' | b')' | b',' | b';' | b'<' | b'>' | b'`') || byte.is_ascii_whitespace()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|window| window == needle)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn changed(name: &str, value: &str) -> Vec<u8> {
        format!("parameter \"{name}\" changed to \"{value}\"").into_bytes()
    }

    fn masked(text: &str) -> String {
        String::from_utf8(mask_secrets(text.as_bytes()).unwrap_or_else(|| text.as_bytes().to_vec())).unwrap()
    }

    #[test]
    fn secret_settings_are_logged_without_their_values() {
        let secret = hidden_setting_change(SETTING_CHANGED.as_bytes(), &changed("outbox.signing_secret", "whsec_c2VjcmV0")).unwrap();
        assert_eq!(secret.to_str().unwrap(), "parameter \"outbox.signing_secret\" changed (value hidden)");
        let url = hidden_setting_change(SETTING_CHANGED.as_bytes(), &changed("outbox.webhook_url", "https://bob:hunter2@h/x?t=1")).unwrap();
        assert!(!url.to_str().unwrap().contains("hunter2"));
    }

    #[test]
    fn a_translated_line_is_hidden_too() {
        let german = "Parameter »\"outbox.signing_secret\"« wurde auf »whsec_c2VjcmV0« geändert".as_bytes();
        assert!(hidden_setting_change(SETTING_CHANGED.as_bytes(), german).is_some());
    }

    #[test]
    fn other_setting_lines_are_left_alone() {
        assert_eq!(hidden_setting_change(SETTING_CHANGED.as_bytes(), &changed("work_mem", "64MB")), None);
        assert_eq!(hidden_setting_change(b"some other message", &changed("outbox.signing_secret", "x")), None);
    }

    #[test]
    fn only_the_secret_is_masked_and_the_statement_stays() {
        assert_eq!(
            masked("statement: SELECT outbox_endpoint_rotate_secret('b', 'whsec_c2VjcmV0c2VjcmV0c2VjcmV0c2VjcmV0', '1 hour')"),
            "statement: SELECT outbox_endpoint_rotate_secret('b', 'whsec_***', '1 hour')"
        );
        assert_eq!(masked("parameters: $1 = 'b', $2 = 'whsec_c2Vj+/cmV0=='"), "parameters: $1 = 'b', $2 = 'whsec_***'");
        assert_eq!(masked("DROP TABLE accounts; /* whsec_ */"), "DROP TABLE accounts; /* whsec_ */");
        assert_eq!(masked("DROP TABLE accounts; /* whsec_x */"), "DROP TABLE accounts; /* whsec_*** */");
    }

    #[test]
    fn a_urls_user_and_password_are_masked_and_its_host_and_path_stay() {
        assert_eq!(
            masked("SELECT outbox_endpoint_set('b', 'https://relay:pa@ss@h.example:8443/x?t=1')"),
            "SELECT outbox_endpoint_set('b', 'https://***@h.example:8443/x?t=1')"
        );
        assert_eq!(masked("EXECUTE s('http://token@127.0.0.1/')"), "EXECUTE s('http://***@127.0.0.1/')");
        assert_eq!(masked("see https://h.example/a@b and mailto:x@y"), "see https://h.example/a@b and mailto:x@y");
        assert_eq!(masked("'http://h' || 'x@y'"), "'http://h' || 'x@y'");
    }

    #[test]
    fn masking_twice_changes_nothing_more() {
        for text in ["x 'whsec_c2VjcmV0' y", "'https://u:p@h/'", "http://@h", "whsec_"] {
            let once = masked(text);
            assert_eq!(mask_secrets(once.as_bytes()), None, "{text} -> {once}");
        }
    }

    #[test]
    fn text_without_secrets_is_not_copied() {
        assert_eq!(mask_secrets(b"SELECT outbox_enqueue('order.placed', '{}')"), None);
        assert_eq!(mask_secrets(b"SELECT outbox_endpoint_set('b', 'https://h.example/')"), None);
        assert_eq!(mask_secrets(b""), None);
    }
}
