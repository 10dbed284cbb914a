// Package embedded is the relay's sink into the embedded broker: it
// publishes outbox events as the broker's internal idempotent producer, so
// that each event lands in the log exactly once, across crashes, takeovers
// and whatever happened to the outbox meanwhile.
//
// # Exactly once, by identity
//
// "Already published?" is decided by the event's identity (its
// relay-event-id header, plus relay-replay for a republished event), never
// by where it is expected to be.
//
//  1. Identity of the writer. At each session start the sink asks the
//     broker for its internal producer "relay" (InitInternalProducer), which
//     bumps the epoch: sequences start at 0, and any batch of an earlier
//     session is refused as stale. No Kafka client can produce under that
//     producer id (the broker refuses it), so its batches in the log are the
//     relay's and nobody else's.
//  2. What was acknowledged. When a batch is durable, the sink's state
//     records, per partition, the log offset just after the relay's last
//     batch there, with the broker's log id and the producer id, and, as
//     runs of offsets, the held records: those step 3 found at this
//     session's start that no durable batch has offered again yet. The
//     core saves that state in the Postgres transaction that deletes the
//     batch's rows: so every relay batch at or after the saved offsets,
//     and every held record below them, may belong to rows that are still
//     in the outbox. (Without the held runs, a batch offered before the
//     held events came again, a replay chunk republished first or a WAL
//     reader re-reading the table in another order, moved the offsets
//     past them, and a crash before they were acknowledged let the next
//     session append them again: TestHeldEventsSurviveLaterAcknowledgements,
//     found by internal/faults' TestReplayAcrossTakeovers.)
//  3. Session start (after a crash, a takeover, a pipeline restart). The
//     sink reads each partition from its saved offset to the end and
//     collects the identities of the records in batches of the relay's
//     producer ids (this session's and the saved state's). A partition the
//     state does not name, or a log whose id differs from the saved one (a
//     replaced data directory), is read from its start, but only where the
//     broker holds producer state for those ids. It also reads the held
//     runs the saved state names (those the log still has), with the
//     producer id that wrote each. The cost is one read of the
//     unacknowledged tail, bounded by what the pipeline keeps in flight
//     (a few batches of --batch-size, plus the acknowledgements queued
//     behind a slow Postgres); it grows only if acknowledgements keep
//     failing session after session.
//  4. Publishing. A message whose identity is in that set is already in
//     the log: it is not appended again, it is reported published (so its
//     row is deleted), and it leaves the set. Every other message is
//     appended, whatever order or set of rows the source delivers: rows an
//     operator deleted, rows a WAL reader re-read from the table after
//     losing its slot in another order, a replay resumed by a new leader.
//  5. Within a session, Kafka's idempotent sequences (starting at 0 with
//     the new epoch, wrapping from MaxInt32 to 0 as Kafka's do) guard each
//     partition's batches; the broker answers a retried batch as a
//     duplicate and refuses a gap.
//
// # Fault model
//
//   - Process killed at any instruction: the rows of unacknowledged
//     batches stay in the outbox; step 3 finds those already in the log.
//   - Leadership lost while the process lives (a dead lock session, a
//     network partition, a pause): the sink checks the session's fence
//     before every append and appends nothing once it fails; the data
//     directory's lock keeps a second process from opening the log until
//     this one closed it, and the new leader's step 3 runs after that.
//   - Operator deletes or truncates outbox rows between publish and ack:
//     their events stay in the set, match nothing, and cost a few bytes
//     until the session ends; no other event is skipped. They also stay
//     held, so each saved state names their runs (a few per partition)
//     and each session start reads them again, until retention deletes
//     their records (TestHeldEventsOfTruncatedRows).
//   - Unacknowledged records damaged on disk (a torn tail cut on open, a
//     flipped bit a read finds): the broker reports their offsets lost;
//     step 3 passes over them with a WARN, and their events, whose
//     identities it cannot read, are appended again when they come, which
//     puts them back in the log (TestDamagedUnacknowledgedRecords). Before,
//     Start failed on the lost range, so the relay could never start.
//   - A full disk: the broker keeps failed segment writes in memory and
//     fails the journal's (internal/broker/journal.go), so appends fail
//     and nothing more is acknowledged. A session starting meanwhile
//     fails to make the last one's appends durable and waits for the disk
//     (the core retries it) with the broker and its Kafka listener still
//     open; only a failed fsync makes it reopen the broker
//     (TestSessionWaitsForAFullDisk).
//   - Sequence counters at their wrap points: nothing compares positions,
//     so a session may append any number of records (tested across 2^30
//     and 2^31).
//   - A Kafka client reusing the relay's producer id, or forging
//     relay-event-id headers: refused by the broker, and ignored by step 3
//     (only the relay's producer ids count).
//
// # Appends side by side
//
// A batch spread over many partitions (a backlog over 1,000 topics gives
// nearly a partition per event) is appended by up to four goroutines
// (at most GOMAXPROCS, one per 64 partitions of the batch), each taking
// 16 partitions at a time; on one core of the relay's two the appends of
// such a batch took most of its time. Each partition's records of the
// batch are appended by one goroutine, in order, and PublishAsync returns
// only once every goroutine is done, so a partition's order across
// batches holds; a partition's sequence moves only in the goroutine that
// appends to it and is handed back after. Every goroutine checks the
// fence before each partition, and all stop at the first failure (a lost
// fence, a refused append): the batches appended by then stay in the log,
// unacknowledged, as those before a failure did with one goroutine, and
// step 3 finds them at the next session's start (TestAppendsSideBySide).
//
// # Missing topics
//
// A topic is created on first use, unless Config.WaitForTopics
// (--create-topics=false): then PublishAsync refuses a batch naming a topic
// the broker does not have with a relay.DestinationError, before it
// appends anything or gives out a sequence number, and puts back into the
// set of step 3 the identities it matched, so the batch the core offers
// again is decided as if it came the first time. The refusal is not
// cached: the broker is asked at every offer. An invalid name, a record
// over the topic's max.message.bytes and a keyless record on a compacted
// topic are the event's faults and go to the dead letters.
//
// # Between sessions
//
// The broker is opened by the first Start, that is only once this relay
// leads, and stays open after Close ends a session: the Kafka listener
// keeps serving consumers (fetches, group membership, offset commits)
// while the pipeline restarts or PostgreSQL is away, and the next Start
// reuses it (running steps 1 and 3 again). Between sessions the sink
// takes no publish and reports not ready. The broker is closed
//   - by Shutdown, when the relay stops;
//   - by Standby, when the core sees that another relay has led since this
//     one did (with data directories of their own, this one's log is no
//     longer the one written);
//   - when another process asks for the directory: a Start that must open
//     the broker first writes TAKEOVER-REQUEST into the directory, then
//     waits for its lock (and removes the file once it has it); a broker
//     kept open between sessions looks for the file every 100 ms and
//     closes when it sees it. A relay in a session ignores it: the core
//     starts a session only as the leader, and the session's Start
//     removes a request it finds, which comes from a process that no
//     longer leads;
//   - and it is reopened by a Start that finds its storage failed (a
//     sticky fsync error is cleared only by reading the log from disk
//     again) or after a publish named a topic deleted since the broker
//     opened (the name is free again only after a reopen).
//
// Fault model of this state:
//   - The leader partitioned from PostgreSQL (its lease runs out) while a
//     standby on the same directory reaches it: the standby takes over and
//     asks for the directory; the old leader, between sessions, closes
//     within a poll, so its listener goes down then rather than when its
//     lease ran out. internal/faults' partition and pause tests show that
//     takeovers still complete; TestBrokerKeptOpenBetweenSessions shows the
//     hand-over itself.
//   - PostgreSQL away for every relay: nobody can take over, and the
//     leader's listener serves what the log holds throughout
//     (TestListenerServesWhilePostgresIsAway in internal/faults).
//   - Process paused between sessions: the waiting process's Start waits
//     for the lock, as it did before this state existed; neither writes
//     meanwhile, since neither is in a session.
//   - Batches of the previous session written but not fsynced (a failed
//     session's waits are abandoned): they are above the high watermark
//     that step 3 reads up to, so the next Start fsyncs a reused broker
//     before step 3, as reopening it did; otherwise they were appended
//     again (TestReusedBrokerSeesAbandonedAppends; first seen as
//     duplicates in cdc's TestE2EPostgresRestartMidStream).
//   - Process killed between sessions: the lock goes with it.
//   - The request file deleted by an operator: the waiting process waits
//     for the lock, as without this mechanism, until the old process stops
//     or sees another leader (Standby).
//   - Two brokers never have the directory open at once: the flock still
//     decides; the request only asks.
//
// # Source files
//
//	embedded.go  the Sink type, its configuration, readiness and Close
//	start.go     Start: the takeover of the data directory and the scan for
//	             events written but not acknowledged; Standby; the linger
//	publish.go   Publish: events grouped per partition and appended, side
//	             by side when partitions are many
//	state.go     the sink's acknowledged positions and held ranges
//	statejson.go their JSON encoding
//	topics.go    topic creation and configuration lookups
package embedded
