package outbox;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.time.Duration;

/**
 * The test program shared by every language's client (see clients/conformance.py):
 *
 *   outbox.Example enqueue-and-rollback TOPIC   enqueue one event in a transaction, roll it back
 *   outbox.Example work                         run OutboxWorker, configured by the environment:
 *       DATABASE_URL, OUTBOX_ENDPOINT, OUTBOX_CONSUMER, WORKER_NAME, HANDLERS, LEASE, POLL_MS,
 *       GRACE_MS, BEHAVIOUR (apply | fail | none: the benchmark's handler, which does nothing), HANDLE_MS
 *
 * `work` prints one line per event on stdout: ready, handled/duplicate/nacked/lost ID ATTEMPT,
 * stopping, stopped; it exits 0 after SIGTERM or SIGINT once in-flight jobs are done.
 */
public final class Example {

    public static void main(String[] args) throws Exception {
        // One line per log record, on stderr (stdout is for the event lines).
        System.setProperty("java.util.logging.SimpleFormatter.format", "%1$tT.%1$tL %4$s %5$s%6$s%n");
        if (args.length == 2 && args[0].equals("enqueue-and-rollback")) {
            enqueueAndRollback(args[1]);
        } else if (args.length == 1 && args[0].equals("work")) {
            work();
        } else {
            System.err.println("usage: outbox.Example enqueue-and-rollback TOPIC | work");
            System.exit(2);
        }
        System.exit(0);
    }

    static void enqueueAndRollback(String topic) throws Exception {
        try (Connection c = OutboxWorker.connect(env("DATABASE_URL", null))) {
            c.setAutoCommit(false);
            try (PreparedStatement ps = c.prepareStatement("SELECT outbox_enqueue(?, '{\"rolled_back\": true}'::jsonb)")) {
                ps.setString(1, topic);
                ps.executeQuery().close();
            }
            c.rollback();
        }
    }

    static void work() {
        String name = env("WORKER_NAME", "java-" + ProcessHandle.current().pid());
        String behaviour = env("BEHAVIOUR", "apply");
        long handleMs = Long.parseLong(env("HANDLE_MS", "0"));
        String endpoint = env("OUTBOX_ENDPOINT", null);

        OutboxWorker worker = new OutboxWorker(env("DATABASE_URL", null), endpoint, (tx, job) -> {
            if (behaviour.equals("fail")) throw new IllegalStateException("always fails");
            if (behaviour.equals("none")) return;
            if (handleMs > 0) Thread.sleep(handleMs);
            try (PreparedStatement ps = tx.prepareStatement("INSERT INTO client_effects (event_id, worker) VALUES (?, ?)")) {
                ps.setLong(1, job.eventId());
                ps.setString(2, name);
                ps.executeUpdate();
            }
        })
            .handlers(Integer.parseInt(env("HANDLERS", "4")))
            .consumer(env("OUTBOX_CONSUMER", endpoint))
            .lease(env("LEASE", "30 seconds"))
            .poll(Duration.ofMillis(Long.parseLong(env("POLL_MS", "1000"))))
            .grace(Duration.ofMillis(Long.parseLong(env("GRACE_MS", "10000"))))
            .schema(env("OUTBOX_SCHEMA", "public"))
            .listener((event, job) -> say(event.name().toLowerCase() + (job == null ? "" : " " + job.eventId() + " " + job.attempt())));
        worker.stopOnSignals();
        worker.run();
    }

    private static synchronized void say(String line) {
        System.out.println(line);
        System.out.flush();
    }

    private static String env(String name, String fallback) {
        String value = System.getenv(name);
        if (value != null && !value.isEmpty()) return value;
        if (fallback == null) {
            System.err.println(name + " is required");
            System.exit(2);
        }
        return fallback;
    }
}
