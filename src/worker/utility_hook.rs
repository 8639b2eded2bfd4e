//! What the relay must hear of two kinds of command, from the backend that runs them (a
//! utility hook every backend inherits from the preloaded library):
//!
//! - `DROP DATABASE` and `ALTER DATABASE … RENAME` of a served database go through without
//!   `FORCE`. PostgreSQL refuses both while other sessions are connected to the database, and
//!   the relay workers always are. The hook first tells that database's workers to leave (they
//!   exit at once, abandoning what is in flight to its lease) and the launcher to start none
//!   there, until the command's transaction ends, committed or not. The launcher then forgets
//!   the dropped database, or starts the workers again in the renamed one (they connect by OID)
//!   or if the command failed.
//! - `CREATE EXTENSION outbox_ext`, once committed, has the launcher look again into the
//!   database if it found no extension there; so does `ALTER DATABASE … SET` or `RESET
//!   outbox.relay` (or `ALTER ROLE …`), after which the database's workers also restart, to
//!   read it.
//!
//! A transaction that ran one of these cannot be prepared (PREPARE TRANSACTION): what the relay
//! must do would then depend on a COMMIT PREPARED that no callback of this session sees.

use std::ffi::CStr;
use std::sync::Mutex;

use pgrx::pg_sys::ffi::pg_guard_ffi_boundary;
use pgrx::prelude::*;
use pgrx::{register_xact_callback, PgXactCallbackEvent};

use super::{registry, wake};
use crate::majors;

static mut PREVIOUS_HOOK: pg_sys::ProcessUtility_hook_type = None;

/// Called from `_PG_init` while shared_preload_libraries is processed; every backend inherits it.
pub fn install() {
    // SAFETY: the postmaster is single-threaded while it loads preloaded libraries; the chain
    // of hooks is saved and called, as PostgreSQL's own modules do.
    unsafe {
        PREVIOUS_HOOK = pg_sys::ProcessUtility_hook;
        pg_sys::ProcessUtility_hook = Some(hear_utility_command);
    }
}

#[pg_guard]
#[allow(clippy::too_many_arguments)]
unsafe extern "C-unwind" fn hear_utility_command(
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
    let statement = unsafe { (*pstmt).utilityStmt };
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
    // SAFETY: as above; a transaction is open while a utility statement runs.
    if unsafe { creates_this_extension(statement) } {
        run();
        let database = registry::my_database();
        register_xact_callback(PgXactCallbackEvent::Commit, move || registry::note_serving_changed(Some(database), false));
        register_xact_callback(PgXactCallbackEvent::PrePrepare, refuse_prepare);
        return;
    }
    // SAFETY: as above.
    if let Some(database) = unsafe { sets_relay_of(statement) } {
        run();
        register_xact_callback(PgXactCallbackEvent::Commit, move || registry::note_serving_changed(database, true));
        register_xact_callback(PgXactCallbackEvent::PrePrepare, refuse_prepare);
        return;
    }
    // SAFETY: as above.
    let Some(database) = (unsafe { will_drop_or_rename_database(statement, context) }) else {
        return run();
    };
    let Some(request) = registry::begin_leaving(database) else {
        return run();
    };
    held_here().push(request);
    wake::wake_workers_of(database);
    // Lifted when the command's own transaction ends, not before: until it commits, the
    // launcher would still find the database and start workers into a half-dropped one. An
    // ERROR lifts it at once (a savepoint's rollback fires no end-of-transaction event).
    register_xact_callback(PgXactCallbackEvent::Commit, lift);
    register_xact_callback(PgXactCallbackEvent::Abort, lift);
    register_xact_callback(PgXactCallbackEvent::PrePrepare, refuse_prepare);
    PgTryBuilder::new(run)
        .catch_others(|error| {
            // Only this command's request: an earlier RENAME of the transaction still holds.
            if let Some(request) = held_here().pop() {
                registry::end_leaving(request);
            }
            error.rethrow()
        })
        .execute();
}

/// The leave requests this backend's transaction made (a RENAME of several databases in one
/// transaction makes several).
static HELD_HERE: Mutex<Vec<registry::LeaveRequest>> = Mutex::new(Vec::new());

fn held_here() -> std::sync::MutexGuard<'static, Vec<registry::LeaveRequest>> {
    HELD_HERE.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Lifts this backend's leave requests; safe to call more than once.
fn lift() {
    let held = std::mem::take(&mut *held_here());
    held.into_iter().for_each(registry::end_leaving);
}

fn refuse_prepare() {
    error!("outbox_ext: cannot PREPARE a transaction that created outbox_ext, changed outbox.relay, or renamed a database it serves");
}

/// Whether `statement` is CREATE EXTENSION outbox_ext.
unsafe fn creates_this_extension(statement: *mut pg_sys::Node) -> bool {
    // SAFETY: the node's tag says which statement struct it is.
    unsafe {
        !statement.is_null()
            && (*statement).type_ == pg_sys::NodeTag::T_CreateExtensionStmt
            && CStr::from_ptr((*(statement as *mut pg_sys::CreateExtensionStmt)).extname).to_bytes() == b"outbox_ext"
    }
}

/// Whether `statement` sets or resets `outbox.relay` for a database, and for which: ALTER
/// DATABASE … SET, or ALTER ROLE … [IN DATABASE …] SET (the workers read their role's settings
/// too; `None`: every database). PostgreSQL checks who may change the setting itself; RESET ALL
/// counts only when a superuser runs it (it leaves the setting alone for others).
unsafe fn sets_relay_of(statement: *mut pg_sys::Node) -> Option<Option<pg_sys::Oid>> {
    // SAFETY: the node's tag says which statement struct it is; get_database_oid is a catalog
    // lookup in the caller's transaction.
    unsafe {
        if statement.is_null() {
            return None;
        }
        let (name, set) = match (*statement).type_ {
            pg_sys::NodeTag::T_AlterDatabaseSetStmt => {
                let alter = &*(statement as *mut pg_sys::AlterDatabaseSetStmt);
                (alter.dbname, alter.setstmt)
            }
            pg_sys::NodeTag::T_AlterRoleSetStmt => {
                let alter = &*(statement as *mut pg_sys::AlterRoleSetStmt);
                (alter.database, alter.setstmt)
            }
            _ => return None,
        };
        if set.is_null() {
            return None;
        }
        let relay = ((*set).kind == pg_sys::VariableSetKind::VAR_RESET_ALL && pg_sys::superuser())
            || (!(*set).name.is_null() && CStr::from_ptr((*set).name).to_bytes().eq_ignore_ascii_case(b"outbox.relay"));
        if !relay {
            return None;
        }
        if name.is_null() {
            return Some(None);
        }
        let database = pg_sys::get_database_oid(name, true);
        (database != pg_sys::InvalidOid).then_some(Some(database))
    }
}

/// The database `statement` drops or renames, if PostgreSQL will go on to attempt it: run by
/// the database's owner (RENAME also needs CREATEDB), from another database, and a DROP
/// outside any transaction block. Anyone else's attempt fails PostgreSQL's own checks, and must
/// not make the workers leave.
unsafe fn will_drop_or_rename_database(statement: *mut pg_sys::Node, context: pg_sys::ProcessUtilityContext::Type) -> Option<pg_sys::Oid> {
    if statement.is_null() {
        return None;
    }
    // SAFETY: the node's tag says which statement struct it is; the checks below are catalog
    // lookups in the caller's transaction, as PostgreSQL's own dropdb and RenameDatabase make.
    unsafe {
        let (name, is_drop) = match (*statement).type_ {
            pg_sys::NodeTag::T_DropdbStmt => ((*(statement as *mut pg_sys::DropdbStmt)).dbname, true),
            pg_sys::NodeTag::T_RenameStmt => {
                let rename = &*(statement as *mut pg_sys::RenameStmt);
                if rename.renameType != pg_sys::ObjectType::OBJECT_DATABASE {
                    return None;
                }
                (rename.subname, false)
            }
            _ => return None,
        };
        if name.is_null()
            || (is_drop && (context != pg_sys::ProcessUtilityContext::PROCESS_UTILITY_TOPLEVEL || pg_sys::IsTransactionBlock()))
        {
            return None;
        }
        let database = pg_sys::get_database_oid(name, true);
        (database != pg_sys::InvalidOid
            && database != pg_sys::MyDatabaseId
            && majors::owns_database(database)
            && (is_drop || pg_sys::have_createdb_privilege()))
        .then_some(database)
    }
}
