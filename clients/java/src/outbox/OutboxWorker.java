package outbox;

/*
 * OutboxWorker: a pull consumer for outbox_ext, on PostgreSQL's JDBC driver alone.
 *
 * Public API:
 *
 *   OutboxWorker worker = new OutboxWorker(databaseUrl, "jobs", (tx, job) -> {
 *           // apply the effect on tx: the job's transaction, committed with its ack
 *       })
 *       .handlers(4)                    // concurrent handlers, each on its own connection (default 4)
 *       .consumer("jobs")               // name for outbox_mark_processed (default: the endpoint)
 *       .lease("30 seconds")            // how long a claim lasts (interval text, default 30 seconds)
 *       .poll(Duration.ofSeconds(1))    // longest wait for a NOTIFY when there is nothing to claim
 *       .grace(Duration.ofSeconds(10))  // how long stop() lets in-flight handlers finish
 *       .listener((event, job) -> ...)  // READY, HANDLED, DUPLICATE, NACKED, LOST, STOPPING, STOPPED
 *       .schema("public");              // the schema outbox_ext was installed in (default public): calls
 *                                       // name it, so no other schema's function of the same name is called
 *   worker.stopOnSignals();             // SIGTERM and SIGINT call stop()
 *   worker.run();                       // blocks until stop(), then returns normally
 *
 *   OutboxWorker.connect(databaseUrl)   // a JDBC connection from a libpq URI (postgresql://...) or a jdbc: URL
 *
 * Each job runs on its handler's connection as one transaction: outbox_mark_processed, the
 * handler (skipped for a duplicate), outbox_ack; committed only if the ack says the claim is
 * still ours, so the effect, the processed mark and the ack commit together or not at all. A
 * handler that throws is rolled back and nacked (the extension decides the retry and when the
 * delivery is dead). A database error is logged and its connection reopened with backoff; a job
 * whose connection died comes back when its lease runs out.
 *
 * Events: READY once the first claim has run (LISTEN is on by then); HANDLED / DUPLICATE when
 * the job committed (DUPLICATE: outbox_mark_processed said it was done before, the handler was
 * skipped); NACKED after a handler failure; LOST when outbox_ack (or outbox_nack) said the claim
 * had passed to another consumer, the transaction being rolled back.
 */

import java.lang.System.Logger.Level;
import java.net.URLDecoder;
import java.net.URLEncoder;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.SQLWarning;
import java.sql.Statement;
import java.time.Duration;
import java.time.OffsetDateTime;
import java.util.ArrayList;
import java.util.List;
import java.util.Objects;
import java.util.Properties;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicBoolean;
import java.util.concurrent.atomic.AtomicInteger;
import org.postgresql.PGConnection;
import org.postgresql.PGNotification;
import org.postgresql.util.PSQLException;
import org.postgresql.util.ServerErrorMessage;

public final class OutboxWorker {

    /** One claimed delivery. payload is the event's jsonb as text. */
    public record Job(long eventId, String topic, String payload, String key, int attempt, OffsetDateTime createdAt) {}

    /** The user's work. tx is in the job's transaction: do not commit, roll back or close it. Throw to nack. */
    @FunctionalInterface
    public interface Handler {
        void handle(Connection tx, Job job) throws Exception;
    }

    public enum Event { READY, HANDLED, DUPLICATE, NACKED, LOST, STOPPING, STOPPED }

    /** Told what happened; job is null for READY, STOPPING and STOPPED. Called from several threads. */
    @FunctionalInterface
    public interface Listener {
        void on(Event event, Job job);
    }

    private static final System.Logger LOG = System.getLogger(OutboxWorker.class.getName());
    private static final long BACKOFF_MIN_MS = 100, BACKOFF_MAX_MS = 5000;
    // The claim loop wakes at least this often, so it sees stop() without being interrupted
    // (interrupting a thread inside JDBC I/O would break its connection).
    private static final int TICK_MS = 200;

    private final String databaseUrl, endpoint;
    private final Handler handler;
    private int handlers = 4;
    private String consumer, lease = "30 seconds";
    private Duration poll = Duration.ofSeconds(1), grace = Duration.ofSeconds(10);
    private Listener listener = (event, job) -> {};
    // Quoted once, here or in schema(). Every function we call is named by it, with its arguments
    // cast to the declared types (strings are bound as varchar): so neither a function of the same
    // name elsewhere on the search_path nor a looser overload can be called instead.
    private String schema = quoteIdent("public");

    private final AtomicBoolean started = new AtomicBoolean(), stopRequested = new AtomicBoolean();
    private volatile boolean stopping;
    private volatile long stopAt;                               // System.nanoTime() of stop()
    private final CountDownLatch finished = new CountDownLatch(1);
    private final List<Slot> slots = new ArrayList<>();
    private final BlockingQueue<Slot> free = new LinkedBlockingQueue<>();

    public OutboxWorker(String databaseUrl, String endpoint, Handler handler) {
        this.databaseUrl = Objects.requireNonNull(databaseUrl, "databaseUrl");
        this.endpoint = Objects.requireNonNull(endpoint, "endpoint");
        this.handler = Objects.requireNonNull(handler, "handler");
        this.consumer = endpoint;
    }

    public OutboxWorker handlers(int n) {
        if (n < 1) throw new IllegalArgumentException("handlers must be at least 1");
        handlers = n;
        return this;
    }

    public OutboxWorker consumer(String name) { consumer = Objects.requireNonNull(name); return this; }
    public OutboxWorker lease(String interval) { lease = Objects.requireNonNull(interval); return this; }
    public OutboxWorker poll(Duration d) { poll = Objects.requireNonNull(d); return this; }
    public OutboxWorker grace(Duration d) { grace = Objects.requireNonNull(d); return this; }
    public OutboxWorker listener(Listener l) { listener = Objects.requireNonNull(l); return this; }
    public OutboxWorker schema(String name) { schema = quoteIdent(Objects.requireNonNull(name)); return this; }

    /** Stops claiming at once; run() then lets in-flight handlers finish (up to grace) and returns. */
    public void stop() {
        if (!stopRequested.compareAndSet(false, true)) return;
        stopAt = System.nanoTime();
        stopping = true;
        emit(Event.STOPPING, null);
    }

    /**
     * SIGTERM and SIGINT call stop(), so run() returns and the process can exit 0. Through
     * sun.misc.Signal (module jdk.unsupported): a shutdown hook would also see the signal, but
     * the JVM would exit with 143 whatever the hook does. A signal the process inherited as
     * ignored stays ignored (as for any JVM: e.g. SIGINT of a background job of a script).
     */
    public OutboxWorker stopOnSignals() {
        for (String name : new String[] {"TERM", "INT"}) {
            try {
                sun.misc.Signal.handle(new sun.misc.Signal(name), signal -> stop());
            } catch (Throwable e) { // -Xrs, or no such signal here: a hook still stops gracefully
                LOG.log(Level.WARNING, "cannot handle SIG" + name + " (" + oneLine(e) + "); using a shutdown hook");
                Runtime.getRuntime().addShutdownHook(new Thread(() -> {
                    stop();
                    try { finished.await(grace.toMillis() + 5000, TimeUnit.MILLISECONDS); } catch (InterruptedException ignored) { }
                }, "outbox-shutdown"));
                break;
            }
        }
        return this;
    }

    /** Claims and handles jobs until stop(); then waits for in-flight handlers up to grace. Call once. */
    public void run() {
        if (!started.compareAndSet(false, true)) throw new IllegalStateException("run() is called once per worker");
        AtomicInteger n = new AtomicInteger();
        // Daemon threads: a handler still stuck after grace must not keep the JVM alive.
        ExecutorService pool = Executors.newFixedThreadPool(handlers, r -> {
            Thread t = new Thread(r, "outbox-" + endpoint + "-handler-" + n.incrementAndGet());
            t.setDaemon(true);
            return t;
        });
        boolean interrupted = false;
        try {
            for (int i = 0; i < handlers; i++) {
                Slot slot = new Slot();
                slots.add(slot);
                pool.execute(() -> release(slot)); // opens its connection off the claim loop's thread
            }
            interrupted = claimLoop(pool);
        } finally {
            interrupted |= drain(pool);
            emit(Event.STOPPED, null);
            finished.countDown();
            if (interrupted) Thread.currentThread().interrupt();
        }
    }

    // ---- claiming ---------------------------------------------------------------------------

    /** Returns whether the thread was interrupted (taken as stop()). */
    private boolean claimLoop(ExecutorService pool) {
        Connection claimer = null;
        PreparedStatement claim = null;
        long backoff = BACKOFF_MIN_MS;
        boolean ready = false;
        List<Slot> taken = new ArrayList<>();
        try {
            while (!stopping) {
                try {
                    if (claimer == null) {
                        claimer = open("claimer", true);
                        if (claimer == null) break; // stopping
                        // LISTEN before the first claim: a job enqueued after it wakes us.
                        try (Statement s = claimer.createStatement()) {
                            s.execute("LISTEN " + quoteIdent("outbox." + endpoint));
                        }
                        claim = claimer.prepareStatement("SELECT event_id, topic, payload::text, key, attempt, created_at FROM "
                            + schema + ".outbox_claim(?::text, ?::integer, ?::interval)");
                    }
                    PGConnection pg = claimer.unwrap(PGConnection.class);
                    // Claim only when a handler is free, as many jobs as there are free handlers.
                    Slot first = free.poll(TICK_MS, TimeUnit.MILLISECONDS);
                    if (first == null) {
                        pg.getNotifications(); // read what piled up (and notice a dead connection) while all are busy
                        continue;
                    }
                    taken.add(first);
                    free.drainTo(taken);
                    if (stopping) break;
                    // Notifications so far are for jobs this claim will see: they must not wake us after it.
                    pg.getNotifications();
                    List<Job> jobs = claim(claim, taken.size());
                    backoff = BACKOFF_MIN_MS;
                    if (!ready) {
                        ready = true;
                        emit(Event.READY, null);
                    }
                    for (Job job : jobs) {
                        Slot slot = taken.remove(taken.size() - 1);
                        pool.execute(() -> work(slot, job));
                    }
                    free.addAll(taken);
                    taken.clear();
                    if (jobs.isEmpty()) awaitNotification(pg);
                } catch (SQLException | RuntimeException e) {
                    free.addAll(taken);
                    taken.clear();
                    LOG.log(Level.WARNING, "outbox " + endpoint + ": claim failed (" + oneLine(e) + "); reconnecting in " + backoff + " ms");
                    closeQuietly(claimer);
                    claimer = null;
                    pause(backoff);
                    backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
                }
            }
        } catch (InterruptedException e) {
            free.addAll(taken);
            stop();
            return true;
        } finally {
            closeQuietly(claimer); // ends the LISTEN; nothing more is claimed
        }
        return false;
    }

    private List<Job> claim(PreparedStatement claim, int max) throws SQLException {
        claim.setString(1, endpoint);
        claim.setInt(2, max);
        claim.setString(3, lease);
        List<Job> jobs = new ArrayList<>();
        try (ResultSet rs = claim.executeQuery()) {
            while (rs.next()) {
                jobs.add(new Job(rs.getLong(1), rs.getString(2), rs.getString(3), rs.getString(4), rs.getInt(5),
                                 rs.getObject(6, OffsetDateTime.class)));
            }
        }
        return jobs;
    }

    /** Until a NOTIFY on "outbox.<endpoint>", poll has passed, or stop(). */
    private void awaitNotification(PGConnection pg) throws SQLException {
        long deadline = System.nanoTime() + poll.toNanos();
        while (!stopping) {
            long left = TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime());
            if (left <= 0) return;
            PGNotification[] got = pg.getNotifications((int) Math.min(left, TICK_MS));
            if (got != null && got.length > 0) return;
        }
    }

    // ---- handling ---------------------------------------------------------------------------

    /** A handler and the connection it owns. Used by one thread at a time: whoever took it from free. */
    private final class Slot {
        volatile Connection conn;
        PreparedStatement mark, ack, nack;

        void drop() {
            closeQuietly(conn);
            conn = null;
        }
    }

    private void work(Slot slot, Job job) {
        try {
            process(slot, job);
        } catch (Throwable e) { // never lose a handler thread: log, and let the lease bring the job back
            LOG.log(Level.ERROR, "outbox " + endpoint + ": event " + job.eventId() + " attempt " + job.attempt()
                    + ": unexpected " + oneLine(e) + "; it returns when its lease runs out", e);
            slot.drop();
        } finally {
            release(slot);
        }
    }

    private void process(Slot slot, Job job) {
        Connection tx = slot.conn;
        boolean fresh, acked;
        try {
            fresh = call(slot.mark, job.eventId(), consumer);
            if (fresh) handler.handle(tx, job);
            acked = call(slot.ack, endpoint, job.eventId(), job.attempt());
        } catch (Exception failure) {
            fail(slot, job, failure);
            return;
        }
        try {
            if (acked) tx.commit();
            else tx.rollback(); // someone else holds the claim now: our effect must not stay
        } catch (SQLException e) {
            // Whether a failed commit happened is unknown here; the delivery row knows, and the
            // lease brings the job back if it did not.
            LOG.log(Level.WARNING, describe(job) + ": commit failed (" + oneLine(e) + "); reconnecting");
            slot.drop();
            return;
        }
        if (!acked) LOG.log(Level.WARNING, describe(job) + ": the claim was lost (lease ran out and another consumer claimed it); rolled back");
        emit(acked ? (fresh ? Event.HANDLED : Event.DUPLICATE) : Event.LOST, job);
    }

    private void fail(Slot slot, Job job, Exception failure) {
        Connection tx = slot.conn;
        try {
            tx.rollback();
        } catch (SQLException e) { // the connection is gone, and the job's claim with it until the lease ends
            LOG.log(Level.WARNING, describe(job) + ": " + oneLine(failure) + "; connection lost (" + oneLine(e) + "); it returns when its lease runs out");
            slot.drop();
            return;
        }
        LOG.log(Level.INFO, describe(job) + " failed: " + oneLine(failure));
        try {
            boolean nacked = call(slot.nack, endpoint, job.eventId(), job.attempt(), oneLine(failure));
            tx.commit();
            emit(nacked ? Event.NACKED : Event.LOST, job);
        } catch (SQLException e) {
            LOG.log(Level.WARNING, describe(job) + ": nack failed (" + oneLine(e) + "); reconnecting; it returns when its lease runs out");
            slot.drop();
        }
    }

    /** Back to the free handlers, with a working connection (reopened with backoff), unless stopping. */
    private void release(Slot slot) {
        if (slot.conn == null) {
            Connection c = open("handler", false);
            if (c == null) return; // stopping
            try {
                slot.mark = c.prepareStatement("SELECT " + schema + ".outbox_mark_processed(?::bigint, ?::text)");
                slot.ack = c.prepareStatement("SELECT " + schema + ".outbox_ack(?::text, ?::bigint, ?::integer)");
                slot.nack = c.prepareStatement("SELECT " + schema + ".outbox_nack(?::text, ?::bigint, ?::integer, ?::text)");
                slot.conn = c;
            } catch (SQLException e) { // not reached with pgjdbc (it prepares lazily), but never strand a slot
                closeQuietly(c);
                pause(BACKOFF_MIN_MS);
                release(slot);
                return;
            }
        }
        if (!stopping) free.add(slot);
    }

    /** Returns whether interrupted. Lets handlers finish until stop() + grace, then closes everything. */
    private boolean drain(ExecutorService pool) {
        stopping = true;
        if (stopAt == 0) stopAt = System.nanoTime();
        pool.shutdown();
        boolean interrupted = false, done = false;
        while (true) { // an interrupt does not cut the grace short: it only asked for stop(), which this is
            try {
                done = pool.awaitTermination(Math.max(0, stopAt + grace.toNanos() - System.nanoTime()), TimeUnit.NANOSECONDS);
                break;
            } catch (InterruptedException e) {
                interrupted = true;
            }
        }
        if (!done) {
            LOG.log(Level.WARNING, "outbox " + endpoint + ": handlers still running after the grace period; closing their connections (their jobs return when their lease runs out)");
            // abort() before interrupting: an interrupted handler must find its connection gone, not nack.
            for (Slot slot : slots) {
                Connection c = slot.conn;
                if (c != null) {
                    try { c.abort(Runnable::run); } catch (SQLException | RuntimeException ignored) { }
                }
            }
            pool.shutdownNow();
        }
        for (Slot slot : slots) closeQuietly(slot.conn);
        return interrupted;
    }

    // ---- connections ------------------------------------------------------------------------

    /** A connection, retried with exponential backoff until it opens; null once stopping. */
    private Connection open(String role, boolean autoCommit) {
        long backoff = BACKOFF_MIN_MS;
        while (!stopping) {
            try {
                Properties props = new Properties();
                String url = jdbcUrl(databaseUrl, props);
                props.putIfAbsent("ApplicationName", "outbox " + role + " " + endpoint);
                props.putIfAbsent("tcpKeepAlive", "true");
                unnamedStatements(props);
                Connection c = DriverManager.getConnection(url, props);
                c.setAutoCommit(autoCommit); // handlers: off, one transaction per job; the claimer: on
                return c;
            } catch (SQLException e) {
                LOG.log(Level.WARNING, "outbox " + endpoint + ": cannot connect the " + role + " (" + oneLine(e) + "); retrying in " + backoff + " ms");
                pause(backoff);
                backoff = Math.min(backoff * 2, BACKOFF_MAX_MS);
            }
        }
        return null;
    }

    /** A JDBC connection for a libpq URI (postgresql://user:password@host:port/db?param=value) or a jdbc: URL. */
    public static Connection connect(String databaseUrl) throws SQLException {
        Properties props = new Properties();
        String url = jdbcUrl(databaseUrl, props);
        unnamedStatements(props);
        return DriverManager.getConnection(url, props);
    }

    /** Unnamed statements only, unless the URL asks otherwise: a pooler in transaction mode
     *  (PgBouncer before 1.21) may run each on another server, where a named one is unknown. */
    static void unnamedStatements(Properties props) {
        props.putIfAbsent("prepareThreshold", "0");
    }

    /** The JDBC URL for a libpq URI; user, password and parameters go to props (no re-encoding). */
    static String jdbcUrl(String url, Properties props) {
        if (url.startsWith("jdbc:")) return url;
        int scheme = url.indexOf("://");
        if (scheme < 0 || !List.of("postgresql", "postgres").contains(url.substring(0, scheme)))
            throw new IllegalArgumentException("not a postgresql:// URI or a jdbc: URL: " + url.replaceAll(":[^:@/]*@", ":***@"));
        String rest = url.substring(scheme + 3), query = "", db = "", port = null;
        int q = rest.indexOf('?');
        if (q >= 0) { query = rest.substring(q + 1); rest = rest.substring(0, q); }
        int slash = rest.indexOf('/');
        if (slash >= 0) { db = rest.substring(slash + 1).replace("+", "%2B"); rest = rest.substring(0, slash); } // pgjdbc reads '+' as ' '
        int at = rest.lastIndexOf('@');
        if (at >= 0) {
            String userInfo = rest.substring(0, at);
            rest = rest.substring(at + 1);
            int colon = userInfo.indexOf(':');
            props.setProperty("user", decode(colon < 0 ? userInfo : userInfo.substring(0, colon)));
            if (colon >= 0) props.setProperty("password", decode(userInfo.substring(colon + 1)));
        }
        for (String pair : query.split("&")) {
            if (pair.isEmpty()) continue;
            int eq = pair.indexOf('=');
            String key = decode(eq < 0 ? pair : pair.substring(0, eq)), value = eq < 0 ? "" : decode(pair.substring(eq + 1));
            switch (key) { // libpq names that JDBC spells differently; the rest (sslmode, user, ...) are the same
                case "application_name" -> props.setProperty("ApplicationName", value);
                case "connect_timeout" -> props.setProperty("connectTimeout", value);
                case "dbname" -> db = URLEncoder.encode(value, StandardCharsets.UTF_8);
                case "host" -> { if (!value.startsWith("/")) rest = value; } // no Unix sockets in pgjdbc
                case "port" -> port = value;
                default -> props.setProperty(key, value);
            }
        }
        if (db.isEmpty() && props.getProperty("user") != null) // libpq's default database: the user's name
            db = URLEncoder.encode(props.getProperty("user"), StandardCharsets.UTF_8);
        if (rest.isEmpty()) rest = "localhost";
        if (port != null && !rest.matches(".*:\\d+") && !rest.contains(",")) rest += ":" + port;
        // pgjdbc takes the same host[:port][,host[:port]] list (and [ipv6]); it decodes the database name.
        return "jdbc:postgresql://" + rest + "/" + db;
    }

    // ---- small helpers ----------------------------------------------------------------------

    private boolean call(PreparedStatement ps, Object... args) throws SQLException {
        for (int i = 0; i < args.length; i++) ps.setObject(i + 1, args[i]);
        boolean result;
        try (ResultSet rs = ps.executeQuery()) {
            rs.next();
            result = rs.getBoolean(1);
        }
        // The server's WARNINGs (outbox_nack: "the delivery ... is dead after N attempts") go to the
        // log; cleared, so they do not pile up on a statement that lives as long as its connection.
        for (SQLWarning w = ps.getWarnings(); w != null; w = w.getNextWarning())
            LOG.log(Level.WARNING, "outbox " + endpoint + ": " + w.getMessage());
        ps.clearWarnings();
        return result;
    }

    private void emit(Event event, Job job) {
        try {
            listener.on(event, job);
        } catch (Throwable e) { // a listener's bug must not take a handler thread down
            LOG.log(Level.ERROR, "outbox " + endpoint + ": listener failed on " + event, e);
        }
    }

    private void pause(long ms) { // sleeps, but returns soon after stop()
        long deadline = System.nanoTime() + TimeUnit.MILLISECONDS.toNanos(ms);
        try {
            while (!stopping && System.nanoTime() < deadline)
                Thread.sleep(Math.max(1, Math.min(TICK_MS, TimeUnit.NANOSECONDS.toMillis(deadline - System.nanoTime()))));
        } catch (InterruptedException e) {
            Thread.currentThread().interrupt();
            stop();
        }
    }

    private String describe(Job job) {
        return "outbox " + endpoint + ": event " + job.eventId() + " attempt " + job.attempt();
    }

    /** The error as one line: the message alone (the class name if it has none). */
    static String oneLine(Throwable e) {
        // A server error's own text, without the Where:/Position: lines pgjdbc appends.
        ServerErrorMessage server = e instanceof PSQLException p ? p.getServerErrorMessage() : null;
        String m = server != null && server.getMessage() != null ? server.getMessage() : e.getMessage();
        if (m == null || m.isBlank()) m = e.getClass().getName();
        m = m.replaceAll("\\s*[\\r\\n]+\\s*", " ").strip();
        return m.length() > 1000 ? m.substring(0, 1000) : m;
    }

    private static String quoteIdent(String name) {
        return '"' + name.replace("\"", "\"\"") + '"';
    }

    private static String decode(String s) { // percent-decoding; '+' stays '+' as in libpq
        return URLDecoder.decode(s.replace("+", "%2B"), StandardCharsets.UTF_8);
    }

    private static void closeQuietly(Connection c) {
        if (c == null) return;
        try { c.close(); } catch (SQLException | RuntimeException ignored) { }
    }
}
