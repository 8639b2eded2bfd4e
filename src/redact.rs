//! Keeping secrets out of the server log. On a reload PostgreSQL's postmaster logs every
//! changed setting with its new value (`parameter "outbox.signing_secret" changed to "…"`).
//! A log hook, installed in the postmaster and so in every process it forks, replaces those
//! lines for the settings that may hold secrets: the signing secret, and the webhook URL
//! (credentials and tokens live in its user, password, path or query). The same hook keeps
//! the text of a statement that may carry an endpoint's secret or URL out of the log: the
//! `STATEMENT:` line PostgreSQL adds to an error, the detail and context of that error (where
//! input and bound parameters are quoted), and the lines of `log_statement` and
//! `log_min_duration_statement`.

use std::ffi::CStr;
use std::sync::atomic::{AtomicBool, Ordering};

use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

/// The untranslated message PostgreSQL logs for a changed setting.
const SETTING_CHANGED: &str = "parameter \"%s\" changed to \"%s\"";
/// The settings whose values never reach the log.
const SECRET_SETTINGS: &[&str] = &["outbox.signing_secret", "outbox.webhook_url"];
/// What a statement that may carry a secret mentions: a secret itself, or a function that
/// takes a secret or a URL.
const SECRET_STATEMENT_MARKS: &[&str] = &["whsec_", "outbox_endpoint_set", "outbox_endpoint_rotate_secret"];
const HIDDEN_STATEMENT: &CStr = c"statement hidden by outbox_ext: it may carry an endpoint's secret or a URL's credentials";
const HIDDEN_DETAIL: &CStr = c"detail hidden by outbox_ext: it may quote an endpoint's secret or a URL's credentials";
const HIDDEN_LINE: &CStr = c"log line hidden by outbox_ext: written while a statement that may carry a secret ran";

/// On while EXECUTE runs a prepared statement whose text may carry a secret: the EXECUTE's own
/// text, which PostgreSQL logs as a failing statement, quotes its arguments.
static EXECUTING_MARKED: AtomicBool = AtomicBool::new(false);

static mut PREVIOUS_HOOK: pg_sys::emit_log_hook_type = None;

/// Called from `_PG_init` in the postmaster, while shared_preload_libraries is processed.
pub fn install_log_hook() {
    // SAFETY: the postmaster is single-threaded while it loads preloaded libraries; the hook
    // chain is saved and called, as PostgreSQL's own modules do.
    unsafe {
        PREVIOUS_HOOK = pg_sys::emit_log_hook;
        pg_sys::emit_log_hook = Some(hide_secret_settings);
    }
}

#[pg_guard]
unsafe extern "C-unwind" fn hide_secret_settings(edata: *mut pg_sys::ErrorData) {
    // SAFETY: PostgreSQL passes the report being emitted; its strings are NUL-terminated and
    // live in the report's memory context, the current one, where pstrdup puts the new
    // message. Nothing below can panic (in the postmaster that would stop the server).
    unsafe {
        let data = &mut *edata;
        if !data.message_id.is_null() && !data.message.is_null() {
            let id = CStr::from_ptr(data.message_id).to_bytes();
            let message = CStr::from_ptr(data.message).to_bytes();
            if let Some(replacement) = hidden_setting_change(id, message) {
                data.message = pg_sys::pstrdup(replacement.as_ptr());
            }
        }
        let marked = |text: *const std::ffi::c_char| !text.is_null() && may_carry_a_secret(CStr::from_ptr(text).to_bytes());
        let log_line = data.elevel == pg_sys::LOG as i32 || data.elevel == pg_sys::LOG_SERVER_ONLY as i32;
        // The running statement may carry a secret: its text (or, for EXECUTE, the prepared
        // statement's) names a function that takes one, or holds one.
        let statement = EXECUTING_MARKED.load(Ordering::Relaxed) || marked(pg_sys::debug_query_string);
        // Inside such a function (outbox.secret_call, set by its own SET clause, so also when
        // it was called by EXECUTE or from another function).
        let inside = crate::settings::SECRET_CALL.get();
        if log_line && (marked(data.message) || marked(data.detail)) {
            // A line that quotes such a statement: log_statement's and the duration lines, and
            // for EXECUTE of a prepared one, the PREPARE in its detail (or auto_explain's plan).
            data.message = pg_sys::pstrdup(HIDDEN_STATEMENT.as_ptr());
            data.detail = std::ptr::null_mut();
            data.detail_log = std::ptr::null_mut();
        } else if log_line && inside {
            // Written for a statement the function runs (auto_explain, an audit extension),
            // which may show its arguments' values.
            data.message = pg_sys::pstrdup(HIDDEN_LINE.as_ptr());
            data.detail = std::ptr::null_mut();
            data.detail_log = std::ptr::null_mut();
        }
        if statement || inside {
            // A report's message goes to the client too and never holds a secret (the input
            // functions of json or interval do not repeat their input in it). Left out of the
            // log: the statement PostgreSQL appends to it, and the detail, where a json parser
            // quotes its input (the client keeps it).
            data.hide_stmt = true;
            if !data.detail.is_null() || !data.detail_log.is_null() {
                data.detail_log = pg_sys::pstrdup(HIDDEN_DETAIL.as_ptr());
            }
        }
        if statement {
            // Left out for the client too, as the log has no field of its own for them: the
            // context, where PostgreSQL lists bound parameters (log_parameter_max_length_on_error)
            // or a json parser quotes its input again, and the query of a nested statement.
            data.context = std::ptr::null_mut();
            data.internalquery = std::ptr::null_mut();
            data.internalpos = 0;
        }
        // A deadlock's report shows the other sessions' statements in its log-only detail.
        if marked(data.detail_log) {
            data.detail_log = pg_sys::pstrdup(HIDDEN_DETAIL.as_ptr());
        }
        if let Some(previous) = PREVIOUS_HOOK {
            previous(edata);
        }
    }
}

/// Whether `statement` is an EXECUTE of a prepared statement whose text may carry a secret.
///
/// # Safety
/// `statement` is null or a valid utility statement node, and a transaction is open.
pub unsafe fn executes_a_marked_statement(statement: *mut pg_sys::Node) -> bool {
    // SAFETY: the node's tag says which statement struct it is; FetchPreparedStatement looks
    // the name up in this session's table (null when there is none: no error is thrown).
    unsafe {
        if statement.is_null() || (*statement).type_ != pg_sys::NodeTag::T_ExecuteStmt {
            return false;
        }
        let prepared = pg_sys::FetchPreparedStatement((*(statement as *mut pg_sys::ExecuteStmt)).name, false);
        !prepared.is_null()
            && !(*prepared).plansource.is_null()
            && !(*(*prepared).plansource).query_string.is_null()
            && may_carry_a_secret(CStr::from_ptr((*(*prepared).plansource).query_string).to_bytes())
    }
}

/// Runs `execute` (an EXECUTE that `executes_a_marked_statement`) with what it logs hidden as
/// for the statement it executes, also when it fails before that statement starts (its
/// arguments cannot be converted, say).
pub fn hiding_what_it_logs<R>(execute: impl FnOnce() -> R) -> R {
    EXECUTING_MARKED.store(true, Ordering::Relaxed);
    // An ERROR is logged once it has unwound out of here, before its transaction aborts: the
    // flag stays on until then.
    register_xact_callback(PgXactCallbackEvent::Abort, || EXECUTING_MARKED.store(false, Ordering::Relaxed));
    let result = execute();
    EXECUTING_MARKED.store(false, Ordering::Relaxed);
    result
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

/// Whether a statement (or a log line quoting one) may carry a secret or a URL's credentials.
pub fn may_carry_a_secret(text: &[u8]) -> bool {
    let text = text.to_ascii_lowercase();
    SECRET_STATEMENT_MARKS.iter().any(|mark| contains(&text, mark.as_bytes()))
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
    fn statements_that_may_carry_a_secret_are_recognised() {
        assert!(may_carry_a_secret(b"SELECT outbox_endpoint_rotate_secret('x', 'whsec_c2VjcmV0')"));
        assert!(may_carry_a_secret(b"select public.outbox_endpoint_set('b', 'https://u:p@h/')"));
        assert!(may_carry_a_secret(b"statement: INSERT INTO t VALUES ('whsec_abc')"));
        assert!(may_carry_a_secret(b"SELECT OUTBOX_ENDPOINT_SET('b', 'https://u:p@h/')"));
        assert!(!may_carry_a_secret(b"SELECT outbox_enqueue('order.placed', '{}')"));
    }

    #[test]
    fn other_lines_are_left_alone() {
        assert_eq!(hidden_setting_change(SETTING_CHANGED.as_bytes(), &changed("work_mem", "64MB")), None);
        assert_eq!(hidden_setting_change(b"some other message", &changed("outbox.signing_secret", "x")), None);
    }
}
