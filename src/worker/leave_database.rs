//! Letting `DROP DATABASE` and `ALTER DATABASE … RENAME` of the served database through
//! without `FORCE`. PostgreSQL refuses both while other sessions are connected to the
//! database, and the relay workers always are. A utility hook, run by the backend executing
//! the command, first tells the workers to leave (they exit at once, abandoning what is in
//! flight to its lease) and the launcher to start none, until the command's transaction ends,
//! committed or not. The launcher then finds the database gone (or renamed) and waits, or
//! starts the workers again if the command failed.

use std::ffi::CStr;

use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

use super::{registry, wake};
use crate::settings;

static mut PREVIOUS_HOOK: pg_sys::ProcessUtility_hook_type = None;

/// Called from `_PG_init` while shared_preload_libraries is processed; every backend inherits it.
pub fn install_utility_hook() {
    // SAFETY: the postmaster is single-threaded while it loads preloaded libraries; the chain
    // of hooks is saved and called, as PostgreSQL's own modules do.
    unsafe {
        PREVIOUS_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(leave_before_drop_or_rename);
    }
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn leave_before_drop_or_rename(
    pstmt: *mut pg_sys::PlannedStmt,
    query_string: *const std::ffi::c_char,
    read_only_tree: bool,
    context: pg_sys::ProcessUtilityContext::Type,
    params: pg_sys::ParamListInfo,
    query_env: *mut pg_sys::QueryEnvironment,
    dest: *mut pg_sys::DestReceiver,
    qc: *mut pg_sys::QueryCompletion,
) {
    // SAFETY: PostgreSQL passes a valid planned utility statement.
    let leaving = unsafe { names_served_database((*pstmt).utilityStmt) };
    let run = || {
        // SAFETY: the arguments are passed on unchanged, to the previous hook or to PostgreSQL.
        unsafe {
            match PREVIOUS_HOOK {
                Some(previous) => pg_guard_ffi_boundary(|| previous(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc)),
                None => pg_sys::standard_ProcessUtility(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc),
            }
        }
    };
    if leaving {
        registry::set_leaving_database(true);
        wake::wake_all_workers();
        // Lifted when the command's own transaction ends, not before: until it commits, the
        // launcher would still find the database and start workers into a half-dropped one.
        register_xact_callback(PgXactCallbackEvent::Commit, || registry::set_leaving_database(false));
        register_xact_callback(PgXactCallbackEvent::Abort, || registry::set_leaving_database(false));
    }
    run();
}

/// Whether `statement` is DROP DATABASE or ALTER DATABASE … RENAME of `outbox.database`.
unsafe fn names_served_database(statement: *mut pg_sys::Node) -> bool {
    if statement.is_null() {
        return false;
    }
    // SAFETY: the node's tag says which statement struct it is.
    let name = unsafe {
        match (*statement).type_ {
            pg_sys::NodeTag::T_DropdbStmt => (*(statement as *mut pg_sys::DropdbStmt)).dbname,
            pg_sys::NodeTag::T_RenameStmt => {
                let rename = &*(statement as *mut pg_sys::RenameStmt);
                if rename.renameType != pg_sys::ObjectType::OBJECT_DATABASE {
                    return false;
                }
                rename.subname
            }
            _ => return false,
        }
    };
    // SAFETY: PostgreSQL's parser gives NUL-terminated names.
    !name.is_null() && unsafe { CStr::from_ptr(name) }.to_bytes() == settings::database().as_bytes()
}
