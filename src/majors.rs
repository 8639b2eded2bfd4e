//! What differs between the PostgreSQL majors the extension builds for, each difference behind
//! one function, chosen when the extension is compiled for a major (the `pg15` or `pg18`
//! feature).

use pgrx::pg_sys;

// 16 and 17 each differ from both: their code comes with their feature.
#[cfg(not(any(feature = "pg15", feature = "pg18")))]
compile_error!("outbox_ext builds for PostgreSQL 15 and 18 (feature pg15 or pg18): src/majors.rs has no code for this major");

/// This process's number among the server's PGPROCs, by which another process finds its latch.
///
/// # Safety
/// Only in a backend or background worker, after its PGPROC is set up.
pub unsafe fn my_proc_number() -> i32 {
    #[cfg(feature = "pg15")]
    return (*pg_sys::MyProc).pgprocno;
    #[cfg(feature = "pg18")]
    return pg_sys::MyProcNumber;
}

/// Whether the current user owns `database` (or is a superuser).
///
/// # Safety
/// In a transaction, on the main thread.
pub unsafe fn owns_database(database: pg_sys::Oid) -> bool {
    #[cfg(feature = "pg15")]
    return pg_sys::pg_database_ownercheck(database, pg_sys::GetUserId());
    #[cfg(feature = "pg18")]
    return pg_sys::object_ownercheck(pg_sys::DatabaseRelationId, database, pg_sys::GetUserId());
}

/// Drops the temporary replication slots this process made, as PostgresMain does after an
/// ERROR (18 also asks whether only synced ones: no, every one).
///
/// # Safety
/// On the main thread, with no slot acquired.
pub unsafe fn drop_temporary_slots() {
    #[cfg(feature = "pg15")]
    pg_sys::ReplicationSlotCleanup();
    #[cfg(feature = "pg18")]
    pg_sys::ReplicationSlotCleanup(false);
}

/// A wait event set that lives until freed. From 17 on, a set belongs to a resource owner
/// unless given none; this one is freed by its maker, so it has none.
///
/// # Safety
/// On the main thread; the caller frees the set with `FreeWaitEventSet`.
pub unsafe fn lasting_wait_event_set(events: i32) -> *mut pg_sys::WaitEventSet {
    #[cfg(feature = "pg15")]
    return pg_sys::CreateWaitEventSet(pg_sys::TopMemoryContext, events);
    #[cfg(feature = "pg18")]
    return pg_sys::CreateWaitEventSet(std::ptr::null_mut(), events);
}

/// Ends this process with `code`, running PostgreSQL's exit callbacks. (18's bindings do not
/// declare proc_exit as not returning.)
///
/// # Safety
/// With no transaction open.
pub unsafe fn exit_process(code: i32) -> ! {
    pg_sys::proc_exit(code);
    #[allow(unreachable_code)]
    {
        unreachable!("proc_exit returned")
    }
}
