// Enqueue from Java with plain JDBC and Spring's transactions: JdbcTemplate writes the order and calls
// outbox_enqueue inside a TransactionTemplate, so both commit or roll back together; outbox_enqueue
// returns the event id, which receivers get as webhook-id. The second order's payment is declined.
// Run: java -cp <Spring, commons-logging, PostgreSQL JDBC> SpringEnqueue   (JDBC_URL=jdbc:postgresql://...)

import java.math.BigDecimal;
import javax.sql.DataSource;
import org.postgresql.ds.PGSimpleDataSource;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.transaction.support.TransactionTemplate;

public final class SpringEnqueue {

    record Placed(long orderId, long eventId) {}

    static final class PaymentDeclined extends RuntimeException {
        final long orderId, eventId;

        PaymentDeclined(long orderId, long eventId) {
            super("payment declined for order " + orderId);
            this.orderId = orderId;
            this.eventId = eventId;
        }
    }

    // The JDK has no JSON library: the database builds the payload from typed parameters.
    private static final String ENQUEUE_ORDER_PLACED =
        "SELECT outbox.outbox_enqueue('order.placed', jsonb_build_object('order_id', ?::bigint, 'customer', ?::text, 'total', ?::text))";

    private final JdbcTemplate jdbc;
    private final TransactionTemplate transactions;

    SpringEnqueue(DataSource dataSource) {
        // One DataSource for both: Spring binds the transaction's connection to the thread per
        // DataSource, and a JdbcTemplate over another one would enqueue on a connection of its
        // own, committed apart from the order.
        this.jdbc = new JdbcTemplate(dataSource);
        this.transactions = new TransactionTemplate(new DataSourceTransactionManager(dataSource));
    }

    /** Saves the order and enqueues order.placed in one transaction: the programmatic form of a
     *  {@code @Transactional} service method, over the same transaction manager. */
    Placed placeOrder(String customer, BigDecimal total, boolean paymentOk) {
        return transactions.execute(status -> {
            long orderId = jdbc.queryForObject(
                "INSERT INTO orders (customer, total) VALUES (?, ?) RETURNING id", Long.class, customer, total);
            long eventId = jdbc.queryForObject(ENQUEUE_ORDER_PLACED, Long.class, orderId, customer, total.toPlainString());
            // A RuntimeException leaving the callback rolls back the order and the event together.
            if (!paymentOk) throw new PaymentDeclined(orderId, eventId);
            return new Placed(orderId, eventId);
        });
    }

    public static void main(String[] args) {
        // An application would use a pool (HikariCP); the transactions work the same over it.
        PGSimpleDataSource dataSource = new PGSimpleDataSource();
        dataSource.setURL(System.getenv("JDBC_URL"));
        SpringEnqueue shop = new SpringEnqueue(dataSource);

        Placed placed = shop.placeOrder("grace", new BigDecimal("31.00"), true);
        System.out.printf("committed order_id=%d event_id=%d%n", placed.orderId(), placed.eventId());
        try {
            shop.placeOrder("heidi", new BigDecimal("2.50"), false);
        } catch (PaymentDeclined declined) {
            System.out.printf("rolled back order_id=%d event_id=%d%n", declined.orderId, declined.eventId);
        }
    }
}
