// Package inbox is the consumer's half of the outbox: it consumes Kafka
// topics in a consumer group and applies each event exactly once to the
// consumer's own PostgreSQL database, whether the records come from the
// relay's embedded log or from Apache Kafka.
//
// The relay delivers at least once: a record can arrive twice (a relay
// restart republishing what it had not acknowledged, a consumer restarting
// from an older committed offset, a rebalance). For each record the
// Consumer opens a transaction, inserts the record's event id (the
// relay-event-id header) into the inbox table, runs the Handler in the same
// transaction, commits, and only then commits the Kafka offset. An id found
// already in the table means the record was applied before: the handler is
// skipped. The handler's database effects and the id commit together, so
// they happen exactly once; effects outside the database (an e-mail, an API
// call) happen at least once and need their own idempotency key, for which
// the event id serves.
//
//	if err := inbox.Migrate(ctx, pool, ""); err != nil { ... }
//	c, err := inbox.New(inbox.Config{
//		DB: pool, Group: "shipping", Topics: []string{"orders"},
//		Kafka: []kgo.Opt{kgo.SeedBrokers("127.0.0.1:9092")},
//		Handler: func(ctx context.Context, tx pgx.Tx, r *kgo.Record) error {
//			_, err := tx.Exec(ctx, "INSERT INTO shipments (order_key) VALUES ($1)", r.Key)
//			return err
//		},
//	})
//	err = c.Run(ctx)
//
// # Order and rebalances
//
// Records of one partition (so of one key) are applied in offset order;
// partitions are applied side by side. Rebalances are blocked while a
// poll's records are applied (kgo.BlockRebalanceOnPoll), and the poll's
// offsets are committed before the rebalance may go on, so a revoked
// partition's work is finished and committed before another member gets
// it. A member that lost its partitions without knowing it (paused past its
// session timeout) may still be applying them while the new owner starts:
// the inbox insert of the second one waits for the first one's transaction
// and then finds the id, so each record is applied by one member only, and
// a member reaches record n of a partition only after n-1 was committed by
// one of them, so the order holds.
//
// # Poison records
//
// A handler that fails is retried with backoff (Config.RetryBackoff) up to
// Config.MaxAttempts; then the record goes to the dead-letter table with
// the last error, in a transaction that also records its id. A failure
// while the database itself is down (a trivial query fails too) is not
// counted against the record: after a few the partition is given back to
// the next poll, from that record. With Policy HoldKey, later records of a
// dead-lettered key wait in the dead-letter table too (held), so the key's
// order is never broken; DeadLetters lists them, Retry applies one (the
// earliest of its key first) and Discard drops one. Attempts are counted in
// memory: a restart starts the count again.
//
// # Forgetting ids
//
// The inbox table would grow forever. Prune (in the background every
// Config.PruneInterval) deletes an id only when both hold:
//   - its record is below the group's committed offset of its partition,
//     read from the cluster: no member is handed that record again, since
//     members start from the committed offsets;
//   - it was processed more than Config.RetainFor ago (default 7 days,
//     Kafka's default retention): a duplicate of the event published later
//     by the relay, at a new offset, arrives within the relay's
//     at-least-once window, which the topic's retention bounds.
//
// # Fault model
//
// Survived, and how it is known:
//   - A member killed at any point (before its database commit: the record
//     is redelivered and applied; between the database commit and the
//     offset commit: redelivered and skipped): TestInboxMembersKilled, with
//     members SIGKILLed and restarted and the relay restarted, and a
//     checker that finds each event's side effect exactly once, in key
//     order.
//   - A rebalance while records are in flight, and a member that lost its
//     partitions but keeps applying: the id's primary key decides;
//     TestInboxMembersKilled (members join and leave throughout) and
//     TestInboxConcurrentApplyOnce (two consumers of one group given the
//     same records at once).
//   - Offsets committed and then moved back (a consumer restarting from an
//     older position, an operator reset) around a prune:
//     TestInboxPruneRedeliveryWindow.
//   - A poison record, with and without HoldKey: TestInboxDeadLetters.
//   - The database unreachable while the handler runs: not counted as an
//     attempt (databaseDown); not injected by a test.
//
// Not covered: effects outside the transaction (see above); a relay
// duplicate arriving after RetainFor and after the group committed past the
// original (set RetainFor to the topic's retention or longer); ids reused
// by different events (the relay's ids are UUIDs).
//
// # Tables
//
// Migrate creates SCHEMA.processed (one row per applied, skipped-forever or
// dead-lettered event id, keyed by group and id), SCHEMA.dead_letters and
// SCHEMA.schema_version. Teams that migrate with their own tool apply
// Migrations instead; Run refuses a schema that is not at this package's
// version.
package inbox
