//! Letting `DROP DATABASE` and `ALTER DATABASE … RENAME` of the served database through
//! without `FORCE`. PostgreSQL refuses both while other sessions are connected to the
//! database, and the relay workers always are. A utility hook, run by the backend executing
//! the command, first tells the workers to leave (they exit at once, abandoning what is in
//! flight to its lease) and the launcher to start none, until the command's transaction ends,
//! committed or not. The launcher then finds the database gone (or renamed) and waits, or
//! starts the workers again if the command failed.

use std::ffi::CStr;
use std::sync::atomic::{AtomicI32, Ordering};

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
    let leaving = unsafe { will_drop_or_rename_served_database((*pstmt).utilityStmt, context) };
    let run = || {
        // SAFETY: the arguments are passed on unchanged, to the previous hook or to PostgreSQL.
        unsafe {
            match PREVIOUS_HOOK {
                Some(previous) => {
                    pg_guard_ffi_boundary(|| previous(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc))
                }
                None => pg_sys::standard_ProcessUtility(pstmt, query_string, read_only_tree, context, params, query_env, dest, qc),
            }
        }
    };
    if !leaving {
        return run();
    }
    HELD_HERE.fetch_add(1, Ordering::SeqCst);
    registry::begin_leaving_database();
    wake::wake_all_workers();
    // Lifted when the command's own transaction ends, not before: until it commits, the
    // launcher would still find the database and start workers into a half-dropped one. An
    // ERROR lifts it at once (a savepoint's rollback fires no end-of-transaction event).
    register_xact_callback(PgXactCallbackEvent::Commit, lift);
    register_xact_callback(PgXactCallbackEvent::Abort, lift);
    PgTryBuilder::new(run)
        .catch_others(|error| {
            lift();
            error.rethrow()
        })
        .execute();
}

/// How many of the running leave requests this backend made (a process-local count).
static HELD_HERE: AtomicI32 = AtomicI32::new(0);

/// Lifts this backend's leave requests; safe to call more than once.
fn lift() {
    let held = HELD_HERE.swap(0, Ordering::SeqCst);
    if held > 0 {
        registry::end_leaving_database(held);
    }
}

/// Whether `statement` is a DROP DATABASE or ALTER DATABASE … RENAME of `outbox.database`
/// that PostgreSQL will go on to attempt: run by the database's owner (RENAME also needs
/// CREATEDB), from another database, and a DROP outside any transaction block. Anyone else's
/// attempt fails PostgreSQL's own checks, and must not make the workers leave.
unsafe fn will_drop_or_rename_served_database(statement: *mut pg_sys::Node, context: pg_sys::ProcessUtilityContext::Type) -> bool {
    if statement.is_null() {
        return false;
    }
    // SAFETY: the node's tag says which statement struct it is; the checks below are catalog
    // lookups in the caller's transaction, as PostgreSQL's own dropdb and RenameDatabase make.
    unsafe {
        let (name, is_drop) = match (*statement).type_ {
            pg_sys::NodeTag::T_DropdbStmt => ((*(statement as *mut pg_sys::DropdbStmt)).dbname, true),
            pg_sys::NodeTag::T_RenameStmt => {
                let rename = &*(statement as *mut pg_sys::RenameStmt);
                if rename.renameType != pg_sys::ObjectType::OBJECT_DATABASE {
                    return false;
                }
                (rename.subname, false)
            }
            _ => return false,
        };
        if name.is_null() || CStr::from_ptr(name).to_bytes() != settings::database().as_bytes() {
            return false;
        }
        if is_drop && (context != pg_sys::ProcessUtilityContext::PROCESS_UTILITY_TOPLEVEL || pg_sys::IsTransactionBlock()) {
            return false;
        }
        let database = pg_sys::get_database_oid(name, true);
        database != pg_sys::InvalidOid
            && database != pg_sys::MyDatabaseId
            && pg_sys::pg_database_ownercheck(database, pg_sys::GetUserId())
            && (is_drop || pg_sys::have_createdb_privilege())
    }
}
