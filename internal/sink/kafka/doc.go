// Package kafka is the relay's sink into Apache Kafka (or any cluster that
// speaks its protocol, the embedded broker's listener included), through
// franz-go's kgo client.
//
// # Producing
//
// The client is an idempotent producer with acks=all. In the at-least-once
// mode the sink is a relay.PipelinedSink: PublishAsync checks the batch
// against its topics, hands every record to the client in order, and
// returns; its wait returns once each record is acknowledged by all
// in-sync replicas. The core keeps up to four batches in flight and calls
// the waits in order, so it deletes outbox rows (and advances the WAL
// slot) only for events Kafka holds durably, and only once every earlier
// record of the batch sequence is durable too. Idempotence keeps each
// partition's records in order and free of duplicates across the client's
// own retries, with up to five produce requests in flight per broker: the
// broker appends a partition's records only in the order of their
// sequence numbers, so a record is never appended before an earlier one
// of its partition that this producer sent.
//
// Batches are compressed (lz4 unless Config.Compression says otherwise).
// Config.Linger is zero by default: the core hands the sink whole batches
// (all the source had, up to its batch size), so a record is sent as soon
// as the client has a free request slot. At a low rate that is at once,
// one request per batch; at a high rate the five requests per broker are
// busy and records gather behind them into large batches, so batches grow
// with the rate without a timer making the low rate wait.
//
// # Pipelined publishing: the fault model
//
// Several batches are outstanding at once, so each fault is decided for
// all of them:
//
//   - The process is killed (SIGKILL, a crash) with batches k..k+3 in
//     flight: none of them is acknowledged in Postgres, whatever Kafka
//     holds of them, so all are re-delivered by the next session, a new
//     producer id: the records Kafka had are published again (the
//     at-least-once repeat below), none is lost. TestE2EKafkaCrashLoop and
//     TestCrashes kill the relay repeatedly under load and count every
//     event.
//   - A broker connection is lost, a leader moves, a request times out:
//     the client retries with the same producer id and sequence numbers,
//     the broker drops what it already has and refuses what comes out of
//     order, so every partition stays in order without repeats. A wait
//     that does not see its batch acknowledged within Config.PublishTimeout
//     (counted from PublishAsync) fails; TestE2EKafkaOutage and TestOutage
//     stop the cluster for 30 s under load: nothing is lost, the relay
//     reports not ready and resumes.
//   - A produce error on batch k while k+1.. are in flight (a record the
//     client gives up on: a topic deleted or unauthorized under the relay,
//     a broker refusing a batch): the first failing record breaks the
//     session at once, from the client's callback: every producer
//     connection is reset (as for a failed fence, below), what the client
//     still buffers is failed, and every later wait and PublishAsync
//     fails, so the core restarts the sink and re-delivers batch k and
//     everything after it. Records already in flight behind the failed
//     one are refused by the broker as out of sequence, and the client
//     fails the partition's later records rather than send them under a
//     new epoch: TestPipelinedErrorStopsLaterBatches holds batch 2's
//     request, sends 3 and 4 behind it, refuses 2, and finds batch 1 alone
//     in the log. (It passes without the sink's reset too: the reset is the
//     sink's own guard, should the client ever retry them under a new
//     epoch, which needs a round trip to the broker that the reset comes
//     before.) The records of k+1.. that Kafka had taken before the
//     failure are published again after the restart (at-least-once
//     repeats); in per-partition order nothing comes before an earlier
//     record that went missing.
//     A topic that failed that way is published synchronously from then
//     on (each batch naming it acknowledged before PublishAsync returns,
//     as in the "Failures" section: the destination's refusals wait
//     without repeats) until a batch naming it goes through.
//   - The fence fails while batches are in flight: a session goroutine
//     checks it every fenceCheckInterval while any batch is outstanding,
//     besides every dial and write, and breaks the session as described
//     under "Fenced leadership": TestPipelinedFenceAbandonsInFlight holds
//     the first of three outstanding batches at the broker and fails the
//     fence; every wait fails, no request reaches the broker again, no
//     record lands (also TestE2EKafkaLeaseKilled).
//
// In the exactly-once mode Publish and PublishAsync are one and the same:
// a Kafka transaction per batch, committed before PublishAsync returns
// (see "Exactly once" for why Kafka allows no more).
//
// Partitioning is the embedded broker's own partitioner,
// broker.PartitionForKey, as a kgo.Partitioner: Kafka's default for keyed
// records (murmur2 of the key, made positive, modulo the partition count,
// checked against the Java client's known answers), so a key has the same
// partition number in the embedded broker and in Kafka. A keyless record is
// placed by the murmur2 of its relay-event-id header, as the embedded
// broker does: keyless events have no order to keep, and a re-delivered
// event lands on the partition of its first copy. A keyless record without
// an event id (the core never makes one) goes where the embedded broker
// would put it too: the partition of the murmur2 of no bytes.
//
// # Topics
//
// The first time a Publish names a topic, the sink asks the cluster about
// it (Metadata, then DescribeConfigs for max.message.bytes and
// cleanup.policy; a cluster that does not answer the latter is assumed to
// use Kafka's defaults). A missing topic is created when Config.CreateTopics
// is set, with Config.Partitions and Config.ReplicationFactor; otherwise
// Publish refuses the batch with a relay.DestinationError wrapping
// ErrTopicMissing and naming the topic, and the core offers the batch again
// until the topic exists. Topics are looked up with a Metadata request of
// the sink's own (not the client's metadata cache, which may be five
// seconds old), and only the topics that exist are cached: a refusal is
// asked about again at every Publish.
//
// # Failures
//
// Publish sorts what goes wrong into three kinds (docs/operating.md's table of
// errors gives each and why):
//
//   - Refusals of the event, reported per message in PublishResult.Failed,
//     which the core moves to the dead letters while everything else flows:
//     an invalid topic name (the relay's rules, or the cluster's
//     INVALID_TOPIC_EXCEPTION), a record larger than the topic's
//     max.message.bytes (checked before producing, on the uncompressed
//     size, so a refused record never takes innocent records of its batch
//     down with it), and a keyless record for a compacted topic.
//   - Refusals by the destination for now, returned as relay.DestinationError
//     (one per topic, joined) for the whole batch, the sink staying usable:
//     a missing topic without CreateTopics, or one deleted under the relay
//     (UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_ID), TOPIC_AUTHORIZATION_FAILED
//     (and CLUSTER_AUTHORIZATION_FAILED on a creation), a create policy's
//     POLICY_VIOLATION, THROTTLING_QUOTA_EXCEEDED on a creation. Those
//     found before producing leave nothing produced. Those found while
//     producing (a Write ACL missing, a topic deleted) come after the
//     client resolved every record of the batch: in the at-least-once mode
//     the identities of the records Kafka acknowledged are kept, and when
//     the core offers the batch again they are not produced a second time
//     (they count as published), so waiting repeats nothing; a restart of
//     the sink forgets them (the at-least-once repeat below). In the
//     exactly-once mode the transaction is aborted, so nothing of the
//     batch is committed.
//   - Everything else (no broker reachable, leader elections, timeouts, a
//     topic deleted under the relay) is an error for the whole Publish, which
//     returns within Config.PublishTimeout. The core keeps the events in the
//     outbox, reports not ready, restarts the sink with backoff and
//     re-delivers them. After an error the sink refuses to publish until that
//     restart, so nothing from the failed attempt is mixed with the retry.
//     One case is loud rather than dead-lettered: a broker refusing a whole
//     batch as too large although each record fits the limits the sink
//     knows (a cluster hiding its topic configs, with a topic limit below
//     the batch size); lower Config.BatchMaxBytes.
//
// Ready sends a Metadata request and fails when no broker answers within a
// few seconds, and fails until Start has finished (in exactly-once mode,
// until the progress markers are read); Start fails when no broker
// answers, so an outage at start-up is an error the core retries too.
//
// # At least once (the default)
//
// Every event is published at least once, in per-key order. When the
// relay stops between Kafka's acknowledgement and the Postgres commit (a
// crash, a Publish error after some records landed, a lost lease), the
// events of the unacknowledged batches are published again: a consumer
// sees each such event twice, both copies carrying the same relay-event-id
// header, so it can deduplicate. Per-key order holds for first copies; a
// repeat may come after later events of its key.
//
// # Fenced leadership: no two relays publish at once
//
// The core hands Start the session's fence (relay.Session.Fence), which
// fails, wrapping relay.ErrNotLeader, once this relay's lease may have run
// out: Lease*4/5 after its last renewal was sent, while a standby takes
// over no earlier than Lease after that renewal committed. The margin M =
// Lease/5 (600 ms with the default 3 s lease) is what the sink has to stop
// in. Kafka cannot help in the at-least-once mode: every session has its
// own idempotent producer id, and a broker appends whatever complete
// request it reads, however late, whatever the client's timeouts
// (ProduceRequestTimeout bounds the broker's wait for replicas, not when
// it appends; RecordDeliveryTimeout and RecordRetries bound when the
// client gives up, not a request already sent; RecordDeliveryTimeout is
// not even usable, since the client measures it from the record's
// timestamp, the event's creation, which would fail every event of a
// backlog older than the timeout). So the sink enforces the
// fence where bytes leave the process, on the producer's connections:
//
//   - Publish and PublishAsync check the fence before they hand anything
//     to the client, and a goroutine of the session checks it every
//     fenceCheckInterval (5 ms) while any record awaits its
//     acknowledgement.
//   - Every connection of the producing client is dialled through the
//     fence (a failed fence refuses the dial), and every write to it checks
//     the fence first. A write the kernel cannot take at once (a full
//     socket buffer) is cut into slices of at most fenceCheckInterval,
//     each after a fresh check, so no byte enters the kernel more than
//     fenceCheckInterval after the fence failed. The client's own
//     deadlines on the connection are kept.
//   - When a check fails, the sink aborts every connection of the client
//     with a TCP reset (SO_LINGER 0), which discards what the kernel still
//     holds unsent, so a request cut short never completes at the broker;
//     it fails the client's buffered records (UnsafeAbortBufferedRecords:
//     they are never retried), refuses every later Publish, and the core
//     closes the client. Retries, metadata refreshes and a new producer id
//     after the failure are refused at the dial or the write.
//
// The bound: once the fence failed, a produce request can still land only
// if its last byte reached the kernel within fenceCheckInterval of the
// failure and was transmitted before the reset (at most another
// fenceCheckInterval while a Publish waits); it then lands when the network
// delivers it and the broker processes it. With the default lease that is
// 10 ms of the 600 ms margin, leaving the network and the broker 590 ms for
// a request already in transit: a broker whose request queue holds a
// request longer than that is the one way two relays' records can still
// interleave in a partition. The same holds for any lease: the sink's part
// is 2*fenceCheckInterval, the rest of Lease/5 is the network's and the
// broker's. Faults and how each is known:
//
//   - Lease session killed, network to Postgres partitioned or silent,
//     Postgres restarted: the renewals fail, the fence fails at the
//     deadline and the sink stops as above, before any standby can take
//     over. TestE2EKafkaLeaseKilled runs two relays on one outbox and one
//     cluster, kills the leader's lease session (and in some rounds every
//     session of the leader, while Postgres refuses new connections, so
//     that the standby takes over), and checks in every partition that no
//     producer's records resume after the next producer's first record.
//   - Fence failing while records are buffered, in flight, or retried
//     after a broker error: TestFenceAbandonsInFlight holds a produce
//     request at the broker, fails the fence and answers it with a
//     retriable error: no further produce request reaches the broker, and
//     none of the records is in the log.
//   - Fence failing after Publish handed the records over but before the
//     client wrote them (it lingers to fill batches):
//     TestFenceCheckedAtTheWrite, no produce request reaches the broker.
//   - A write blocked on a full socket buffer when the fence fails:
//     TestFencedConnStopsABlockedWrite.
//   - Process paused (SIGSTOP, a VM freeze): the fence is on the monotonic
//     clock, so it has failed when the process resumes, before its next
//     check. Not covered: a pause landing exactly between a passing check
//     and the write system call after it (a window of microseconds) lets
//     that one write through on resume. Only the exactly-once mode, where
//     the broker itself fences a deposed producer, closes that window.
//   - Clock steps: only monotonic durations are compared (see the relay
//     package's leadership).
//
// # Exactly once (Config.TransactionalID)
//
// Each Publish is one Kafka transaction holding its events and a progress
// marker: a record in Config.ProgressTopic, keyed by the transactional id,
// naming every event of the transaction by a 16-byte digest of its
// identity (relay.Message.Identity: the SHA-256 of its relay-event-id,
// and of its relay-replay request for a republished event, so a replay is
// never taken for its original nor the original for a replay). The
// State Publish returns for the core to save with the acknowledgement
// holds the offset of that marker and the digests of any committed events
// not yet re-delivered (usually none).
//
// Start first commits a small transaction of its own. That makes the
// cluster fence every earlier producer with the same transactional id: an
// open transaction of a crashed or stale relay is aborted, one caught
// mid-commit is completed, and neither can commit anything later. So a
// deposed leader can commit nothing once the new leader's Start has begun
// its first transaction, whatever its own fence says; before that, what
// it commits is in the markers the new leader reads next. Its own fence
// is checked besides before every produce and again right before
// EndTransaction's commit, so a deposed leader usually stops before the
// broker has to refuse it. Start then reads the progress partition, read_committed, from the saved offset
// to its own record: the markers it finds are the transactions Kafka
// committed after the last acknowledgement Postgres kept. Their events are
// still in the outbox, and the core delivers them again; Publish recognises
// them by digest, skips them (they count as published), and produces the
// rest. Nothing in recovery is decided by position: the progress offset
// only says where to start reading markers, and which events are skipped
// is decided by each one's identity alone, whatever the order and the set
// the core re-delivers (rows deleted by hand, a source re-reading the
// table in another order, replays interleaved with live events).
// TestRecoveryByIdentity re-delivers a committed batch reordered, with a
// replay of one of its events ahead of the original and a new event in
// between: the replay and the new event are published, only the originals
// skipped.
//
// Guaranteed, for consumers reading read_committed, while the
// transactional id and the progress topic's markers are kept:
//
//   - every event that leaves the outbox (other than to the dead letters)
//     is in Kafka exactly once, across crashes at any instruction (before,
//     during or after the Kafka commit, before or after the Postgres ack),
//     Kafka outages, commits whose outcome the client never learned, and
//     leader changes between relays using the same transactional id;
//   - per-key order, as in the at-least-once mode (there are no repeats).
//
// Not guaranteed:
//
//   - read_uncommitted consumers also see records of aborted transactions
//     (after a Publish error), which the retry publishes again;
//   - two outboxes (or two relays not sharing the leader lock) must not
//     share a transactional id: each fences the other. Changing the id, or
//     starting a new outbox with an old id, loses the record of what was
//     committed (the first case may repeat events once; the second reads the
//     old markers and waits for events that never come, see below);
//   - markers expire with the progress topic's retention (created with
//     seven days): a relay that is down longer than that, with a batch
//     committed but not acknowledged, may publish that batch again (it logs
//     a warning);
//   - the sink waits for a committed event's re-delivery for one million
//     published messages after it learned of it, then forgets it (with a
//     warning) so that events which will never come back (rows deleted by
//     hand) do not grow the saved state for ever; the source re-delivers
//     such events first, so only a source breaking its ordering promise by
//     that much could cause a repeat;
//   - events are told apart by identity (relay-event-id, plus relay-replay
//     for replays): messages without the id header (the core always sets
//     it) are told apart by their whole content.
//
// Transactions cost two round trips per Publish and a marker of 16 bytes
// per event; the progress topic needs Write and Describe, the
// transactional id Write and Describe ACLs.
//
// The exactly-once mode does not pipeline. A transactional id has at most
// one open transaction, and a batch's transaction can begin only once the
// previous one's EndTransaction has answered; its records cannot be
// produced before (they would join the previous transaction, whose marker
// does not name them). Nor can the core acknowledge a batch whose commit
// is not decided. So PublishAsync runs the whole transaction and returns a
// wait that is already done; the core still reads and acknowledges in
// parallel with it.
//
// # Configuration
//
// See Config: brokers, client id, TLS (CA file, client certificate,
// skip-verify for tests), SASL (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512; the
// password never appears in logs or errors), compression, linger, batch
// size, topic creation, the transactional id and progress topic, and the
// timeouts.
package kafka
