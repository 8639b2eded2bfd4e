//! Every `outbox.*` setting: declared once with its bounds, unit and context, and read into a
//! plain snapshot that the worker hands to code off the main thread.

use std::ffi::{CStr, CString};

use pgrx::guc::{GucContext, GucFlags, GucRegistry, GucSetting};
use pgrx::prelude::*;

use outbox_core::delivery::Destinations;
pub use outbox_core::settings::Settings;
use outbox_core::settings::{defaults, millis, seconds};

pub static DATABASE: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
pub static WORKERS: GucSetting<i32> = GucSetting::<i32>::new(1);
pub static RELAY: GucSetting<bool> = GucSetting::<bool>::new(true);
pub static WEBHOOK_URL: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
pub static SIGNING_SECRET: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c""));
pub static BATCH_SIZE: GucSetting<i32> = GucSetting::<i32>::new(defaults::BATCH_SIZE);
pub static CONCURRENCY: GucSetting<i32> = GucSetting::<i32>::new(defaults::CONCURRENCY);
pub static LEASE_MS: GucSetting<i32> = GucSetting::<i32>::new(defaults::LEASE_MS);
pub static MAX_ATTEMPTS: GucSetting<i32> = GucSetting::<i32>::new(defaults::MAX_ATTEMPTS);
pub static HTTP_TIMEOUT_MS: GucSetting<i32> = GucSetting::<i32>::new(defaults::HTTP_TIMEOUT_MS);
pub static POLL_INTERVAL_MS: GucSetting<i32> = GucSetting::<i32>::new(defaults::POLL_INTERVAL_MS);
pub static RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(defaults::RETENTION_S);
pub static ENDPOINT_DISABLE_AFTER_S: GucSetting<i32> = GucSetting::<i32>::new(defaults::ENDPOINT_DISABLE_AFTER_S);
pub static MAX_PAYLOAD_BYTES: GucSetting<i32> = GucSetting::<i32>::new(1024 * 1024);
pub static ALLOWED_DESTINATIONS: GucSetting<Option<CString>> = GucSetting::<Option<CString>>::new(Some(c"0.0.0.0/0, ::/0"));
pub static MAX_REQUESTS_IN_FLIGHT: GucSetting<i32> = GucSetting::<i32>::new(defaults::MAX_REQUESTS_IN_FLIGHT);
pub static MAX_BYTES_IN_FLIGHT: GucSetting<i32> = GucSetting::<i32>::new(defaults::MAX_BYTES_IN_FLIGHT);
pub static DEAD_RETENTION_S: GucSetting<i32> = GucSetting::<i32>::new(defaults::DEAD_RETENTION_S);
pub static DELIVER_AT_HORIZON_S: GucSetting<i32> = GucSetting::<i32>::new(90 * 24 * 3600);

/// The most relay workers per database (the registry bounds them over all databases).
pub const MAX_WORKERS: usize = 32;
const HOUR_MS: i32 = 3_600_000;

/// Defines the settings; those of the workers, which only start with the server, only while
/// the library is preloaded (`preloading`): PostgreSQL ends the session (FATAL) that defines a
/// postmaster setting after start-up, as a library loaded by a function's first call would.
pub fn register(preloading: bool) {
    use GucContext::{Sighup, Suset};
    let none = GucFlags::empty();
    let ms = GucFlags::UNIT_MS;

    if preloading {
        register_workers();
    }
    GucRegistry::define_bool_guc(
        c"outbox.relay",
        c"Whether the relay workers serve this database.",
        c"Set per database (ALTER DATABASE … SET outbox.relay = off), e.g. on a restored copy that must not deliver.",
        &RELAY,
        Suset,
        none,
    );
    // Superuser-only to read: a URL may carry credentials or a token.
    GucRegistry::define_string_guc(
        c"outbox.webhook_url",
        c"URL of the endpoint default, when its url is null.",
        c"http:// or https://. Empty means the default endpoint's deliveries wait.",
        &WEBHOOK_URL,
        Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    // Still declared so that nobody but a superuser can read a value left in postgresql.conf
    // (an undeclared one would be readable by every role), and so that ALTER EXTENSION
    // outbox_ext UPDATE from 0.1.0 can copy it into the default endpoint's secrets.
    GucRegistry::define_string_guc(
        c"outbox.signing_secret",
        c"No longer used (0.1.0's signing secret).",
        c"Read once, by the update from 0.1.0; use outbox_endpoint_rotate_secret() and remove this setting.",
        &SIGNING_SECRET,
        Sighup,
        GucFlags::SUPERUSER_ONLY,
    );
    // SAFETY: the check hook is guarded and only reads the value PostgreSQL passes it.
    unsafe {
        GucRegistry::define_string_guc_with_hooks(
            c"outbox.allowed_destinations",
            c"Addresses the relay may connect to: CIDR blocks, each optionally with :port, comma-separated.",
            c"Checked on the address a URL's host parses or resolves to. Cloud metadata services' addresses (169.254.0.0/16, fe80::/10, fd00:ec2::254, 100.100.100.200) only when a block within them is listed. Empty allows nothing.",
            &ALLOWED_DESTINATIONS,
            Sighup,
            // Where the network's receivers live is the superusers' to know.
            GucFlags::SUPERUSER_ONLY,
            Some(check_allowed_destinations),
            None,
            None,
        );
    }
    GucRegistry::define_int_guc(
        c"outbox.max_requests_in_flight",
        c"Most requests a relay worker has in flight over all endpoints.",
        c"Each endpoint also keeps to its max_in_flight; endpoints with work share this fairly, so hanging ones cannot take every slot.",
        &MAX_REQUESTS_IN_FLIGHT,
        1,
        10_000,
        Sighup,
        none,
    );
    GucRegistry::define_int_guc(
        c"outbox.max_bytes_in_flight",
        c"Most bytes of request bodies a relay worker holds over all endpoints.",
        c"A claim takes no more than fits; one delivery is always taken, whatever its size.",
        &MAX_BYTES_IN_FLIGHT,
        1024 * 1024,
        i32::MAX,
        Sighup,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(c"outbox.batch_size", c"Most events one claim takes.", c"", &BATCH_SIZE, 1, 10_000, Sighup, none);
    GucRegistry::define_int_guc(
        c"outbox.concurrency",
        c"Most requests one worker has in flight.",
        c"Requests share keep-alive connections to the receiver.",
        &CONCURRENCY,
        1,
        1_000,
        Sighup,
        none,
    );
    GucRegistry::define_int_guc(
        c"outbox.lease",
        c"How long a claimed event stays invisible to other claimers.",
        c"If the worker dies, the event is claimed again once the lease runs out. A claim's lease is at least the endpoint's request timeout plus 5 s, whatever this says.",
        &LEASE_MS,
        1_000,
        24 * HOUR_MS,
        Sighup,
        ms,
    );
    GucRegistry::define_int_guc(
        c"outbox.max_attempts",
        c"Attempts before an event is marked dead.",
        c"",
        &MAX_ATTEMPTS,
        1,
        1_000,
        Sighup,
        none,
    );
    GucRegistry::define_int_guc(
        c"outbox.http_timeout",
        c"Whole-request timeout of one delivery.",
        c"Connect, send and read the answer must all finish within it.",
        &HTTP_TIMEOUT_MS,
        10,
        HOUR_MS,
        Sighup,
        ms,
    );
    GucRegistry::define_int_guc(
        c"outbox.poll_interval",
        c"Fallback poll when no commit woke the worker.",
        c"",
        &POLL_INTERVAL_MS,
        10,
        HOUR_MS,
        Sighup,
        ms,
    );
    GucRegistry::define_int_guc(
        c"outbox.retention",
        c"How long sent events are kept before the workers delete them.",
        c"0 keeps them forever. Dead and pending events are never deleted.",
        &RETENTION_S,
        0,
        i32::MAX,
        Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"outbox.dead_retention",
        c"How long dead deliveries are kept before the workers delete them.",
        c"Counted from when the delivery went dead; 0 keeps them forever. An event goes with its last delivery.",
        &DEAD_RETENTION_S,
        0,
        i32::MAX,
        Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"outbox.endpoint_disable_after",
        c"An endpoint failing without a success this long is disabled.",
        c"Its deliveries wait until outbox_endpoint_enable(). 0 never disables an endpoint.",
        &ENDPOINT_DISABLE_AFTER_S,
        0,
        i32::MAX,
        Sighup,
        GucFlags::UNIT_S,
    );
    GucRegistry::define_int_guc(
        c"outbox.max_payload_bytes",
        c"Largest payload outbox_enqueue accepts.",
        c"Measured as the payload's JSON text, which is what the receiver gets.",
        &MAX_PAYLOAD_BYTES,
        1,
        i32::MAX,
        Suset,
        GucFlags::UNIT_BYTE,
    );
    GucRegistry::define_int_guc(
        c"outbox.deliver_at_horizon",
        c"Furthest in the future outbox_enqueue accepts a deliver_at.",
        c"A scheduled delivery is kept, and on an ordered endpoint holds its key, until it is due.",
        &DELIVER_AT_HORIZON_S,
        1,
        i32::MAX,
        Suset,
        GucFlags::UNIT_S,
    );
}

/// Refuses a value of `outbox.allowed_destinations` that does not parse, naming the entry, so
/// that a typo is reported where it is made and never takes effect.
#[pg_guard]
unsafe extern "C-unwind" fn check_allowed_destinations(
    value: *mut *mut std::ffi::c_char,
    _extra: *mut *mut std::ffi::c_void,
    _source: pg_sys::GucSource::Type,
) -> bool {
    // SAFETY: PostgreSQL passes the proposed value, a NUL-terminated string (null for none);
    // the detail is palloc'd in the current context, as GUC_check_errdetail does.
    unsafe {
        if value.is_null() || (*value).is_null() {
            return true;
        }
        match Destinations::parse(&CStr::from_ptr(*value).to_string_lossy()) {
            Ok(_) => true,
            Err(e) => {
                let detail = CString::new(e.to_string()).unwrap_or_default();
                pg_sys::GUC_check_errdetail_string = pg_sys::pstrdup(detail.as_ptr());
                false
            }
        }
    }
}

/// The settings read when the server starts the workers.
fn register_workers() {
    let none = GucFlags::empty();
    GucRegistry::define_string_guc(
        c"outbox.database",
        c"The only database the relay workers serve; empty serves every database.",
        c"Empty: every database where outbox_ext is installed is served. Set: only this one.",
        &DATABASE,
        GucContext::Postmaster,
        none,
    );
    GucRegistry::define_int_guc(
        c"outbox.workers",
        c"Relay workers per database with outbox_ext.",
        c"Each worker claims and delivers events on its own; they share the queue through row locks. 0 starts no launcher.",
        &WORKERS,
        0,
        MAX_WORKERS as i32,
        GucContext::Postmaster,
        none,
    );
}

/// Does nothing: calling it loads the library into a session that had not loaded it, so that
/// the settings above replace the placeholders of their names (`sql/library_settings.sql`).
#[pg_extern(sql = false)]
fn outbox_load_settings() {}

/// `outbox.database`: empty for every database.
pub fn database() -> String {
    string_value(&DATABASE)
}

pub fn workers() -> usize {
    WORKERS.get() as usize
}

/// `outbox.relay` as the worker's database sets it (read when the worker connected).
pub fn relay() -> bool {
    RELAY.get()
}

/// The relay's settings as they are now in this backend.
pub fn read() -> Settings {
    Settings {
        webhook_url: string_value(&WEBHOOK_URL).trim().to_string(),
        webhook_url_from: "outbox.webhook_url",
        http_timeout: millis(HTTP_TIMEOUT_MS.get()),
        batch_size: BATCH_SIZE.get() as usize,
        concurrency: CONCURRENCY.get() as usize,
        lease: millis(LEASE_MS.get()),
        poll_interval: millis(POLL_INTERVAL_MS.get()),
        retention: seconds(RETENTION_S.get()),
        endpoint_disable_after: seconds(ENDPOINT_DISABLE_AFTER_S.get()),
        dead_retention: seconds(DEAD_RETENTION_S.get()),
        allowed_destinations: string_value(&ALLOWED_DESTINATIONS),
        server_allowed_destinations: None,
        max_requests_in_flight: MAX_REQUESTS_IN_FLIGHT.get() as usize,
        max_bytes_in_flight: MAX_BYTES_IN_FLIGHT.get() as usize,
    }
}

fn string_value(setting: &GucSetting<Option<CString>>) -> String {
    setting.get().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default()
}
