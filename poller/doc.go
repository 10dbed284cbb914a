// Package poller reads the outbox with plain SQL: the polling reader.
//
// The statements' text is in relay/store (PollReader, built from the
// schema and the message limit); this package owns what they are for: the
// ticks, the batches and their order, the byte budget of a page, and the
// restart from a checkpoint. The reasons for the statements' shapes below
// hold for the text there.
//
// # Approach: ticks (snapshot deltas, as in PgQ)
//
// An outbox row's ordering id is assigned at INSERT but becomes visible at
// COMMIT, so a cursor "id > last seen" skips a row whose transaction took a
// low id and committed late, and a cursor on the writing transaction's id
// (txid) publishes in transaction-start order, which is not commit order.
// The poller instead records ticks: a tick is pg_current_snapshot(), the
// set of transactions committed at that moment. The batch of tick n is the
// outbox rows whose writing transaction (the txid column, an xid8 filled by
// pg_current_xact_id()) is visible in tick n and was not visible in tick
// n-1:
//
//	pg_visible_in_snapshot(txid, tick n) AND NOT pg_visible_in_snapshot(txid, tick n-1)
//
// A transaction still running at tick n is not visible in it; its rows land
// in the batch of the first tick in which it is, whatever ids they took. A
// long transaction, in this database or any other of the cluster, delays
// only its own rows. The first batch after a (re)start is every visible row
// still in the outbox: the core deletes a row when it is acknowledged, so
// those are exactly the unacknowledged events.
//
// Within a batch the rows are ordered
//   - by commit timestamp, then transaction id, then row id, when the server
//     runs with track_commit_timestamp = on (detected at Start; a row whose
//     transaction has no recorded timestamp, because it committed before the
//     setting was turned on or its timestamp was truncated with the commit
//     log, sorts first);
//   - by row id (insertion order) otherwise.
//
// # The ordering guarantee, exactly
//
// Batches follow ticks, and a transaction visible in a tick is visible in
// every later one, so if T1 committed (its commit became visible) before T2
// committed, T1's rows are in the same or an earlier batch than T2's. Within
// a batch:
//   - If T1 committed before T2 inserted its outbox row (the case of writers
//     serialized by a lock they take before writing the event: T2 waits for
//     T1 to commit), T1's row has the lower id, so T1's event comes first in
//     either mode. This holds whatever the order of the two transaction ids
//     (T2 may have taken its id first by writing elsewhere).
//   - With track_commit_timestamp on, T1 comes first whenever its commit
//     timestamp is lower, also when T2 wrote its event before waiting on
//     T1's lock. Commit timestamps come from the server's wall clock: a clock
//     stepped backwards between the two commits can reverse two transactions
//     that land in the same batch.
//   - With track_commit_timestamp off, an event written before the lock
//     that serializes it is published in insertion order, which may differ
//     from commit order. Write the event after taking the lock, or turn the
//     setting on.
//
// The rows of one transaction keep their insertion order and are contiguous
// in the commit-timestamp order; in row-id order they may interleave with
// the rows of a concurrent transaction of the same batch. A batch larger
// than the core's batch size is returned over several calls to Next.
//
// # Positions
//
// An event's relay.Position is (tick number, ordinal within the tick's
// batch). Positions strictly increase. Start(from) makes every new tick
// number greater than from.Major, so positions stay above the checkpoint
// whatever wrote it (a checkpoint of the previous, transaction-id based
// reader included: its events are not dropped as already published).
//
// # What is persisted, and the faults it survives
//
// A tick is recorded in <schema>.poll_ticks (tick number, snapshot, and
// whether its batch is ordered by commit timestamp) in the same statement
// that reads the batch's first rows, before any of them is delivered; a
// tick whose batch is empty is not recorded and costs no transaction id.
// Ticks below the acknowledged one are deleted with the next tick. So the
// table holds the ticks of unacknowledged batches only.
//
//   - Process killed (SIGKILL), connection lost, leader change: Start with
//     the checkpoint (n, k) delivers again the rest of tick n's batch (the
//     rows still in the outbox that are visible in tick n), then the batches
//     of the recorded ticks after n, in the order they were first delivered,
//     then new ticks. The unacknowledged rows therefore come again in the
//     order and with the batch boundaries they first had; tests kill the
//     relay at random moments and read the whole log back
//     (TestCrashLoopExactlyOnce, TestHotKeysCommitOrder).
//   - PostgreSQL crash: ticks are committed without waiting for their WAL
//     flush (synchronous_commit is off on the reader's connection), which
//     spares a flush per batch. The core's acknowledgement commits
//     synchronously and so flushes every tick before it; a server crash can
//     lose only ticks of unacknowledged batches, and their events are then
//     delivered again after the checkpoint in the order of new ticks, which
//     may differ from the first. That relies on the sink deduplicating
//     re-delivered events by identity, not by their order.
//   - Paused process: the reader holds no snapshot and no transaction
//     between calls, so a paused relay holds nothing back in the server.
//     If it wakes after another relay took over, the core's leadership
//     keeps it from acknowledging; a tick it records meanwhile either
//     collides with one of the new leader's on the primary key (an error
//     and a restart) or is one more snapshot in the tick sequence. Batches
//     are the deltas between successive recorded snapshots, so such a tick
//     skips nothing, but it may change the re-delivery order after a later
//     crash. A relay paused while asleep keeps its sleep lock (see
//     "Wake-up and cost"), so writers go on notifying and a new leader's
//     reader, refused the lock, reads every 16 ms until the paused
//     session ends. No test pauses a relay.
//   - Transaction-id wraparound: txid and snapshots are 64-bit (xid8,
//     pg_snapshot), which do not wrap; visibility is computed from the
//     snapshots alone, not from the commit log, so it stays right for rows
//     of any age. The commit-timestamp lookup converts to a 32-bit xid; an
//     event left unpublished for more than about two billion transactions
//     may get a wrong or no timestamp and so a wrong place in its batch.
//   - Operator edits: outbox rows are immutable (migration 011's trigger
//     refuses UPDATE, DELETE and TRUNCATE unless the transaction set
//     relay.allow_outbox_changes, as the core's acknowledgement does), so
//     the poller reads every row as it was inserted, which is what the WAL
//     reader sends. An operator who overrides the trigger to delete rows
//     drops those events if they were not yet read;
//     deleting rows of poll_ticks, or truncating it, loses only the exact
//     re-delivery order after a crash (the reader then starts from every
//     visible row); writing txid at INSERT breaks the guarantee for that
//     row.
//     Turning track_commit_timestamp off while ticks ordered by it are
//     unacknowledged re-delivers them in row-id order (logged).
//   - Clock steps: ordering never uses the relay's clock. The server's clock
//     matters only for commit timestamps, as said above.
//   - A dump and restore into a new cluster changes transaction ids: drain
//     the outbox first and truncate poll_ticks.
//
// # Wake-up and cost
//
// The reader sleeps only when there is nothing to read, and writers wake
// it with NOTIFY on "<schema>.events" only while it sleeps. NOTIFY is not
// free: a notifying transaction takes one cluster-wide lock at commit and
// holds it until its commit record is flushed, so writers that all notify
// commit one after another, each behind the others' fsyncs (seen in relay
// bench: writers waiting on that lock more than half their time, short of
// the rate asked, and the INSERT-to-publish p50 growing with it).
//
// The sleep lock is a session advisory lock on the reader's connection,
// keyed on the outbox table (migration 013). An AFTER INSERT statement
// trigger takes it shared for the writing transaction when it can and then
// sends nothing; when the reader holds it, the trigger notifies instead. A
// goroutine LISTENs on a connection of its own and wakes Next, coalescing
// bursts into one read. When a read finds nothing, Next
//  1. takes the sleep lock (pg_try_advisory_lock); if a writing
//     transaction holds it shared, reads again after a wait that doubles
//     from 1 ms to 16 ms, and does not sleep;
//  2. reads again;
//  3. only if that read finds nothing either, waits for a notification or
//     PollInterval, then releases the lock and reads.
//
// Why no commit is missed: a writer W either took the lock shared, and then
// holds it until its commit is visible (PostgreSQL releases a transaction's
// locks after it leaves the running set), so step 1 succeeds only after W's
// rows are visible and step 2 reads them; or it found the lock held by the
// reader, and then W notifies at commit and wakes step 3. A notification
// lost while the listening connection is down, and any gap in this
// argument, cost at most PollInterval: Next reads on that interval in any
// case. If the reader's session ends while it sleeps (the server
// restarted, or an operator terminated the backend), the lock goes with it
// and commits stop notifying: Next then fails when it releases the lock,
// at PollInterval at the latest, and the core's restart reads everything
// (TestSleepingReaderSessionEnds). relay/store's TestSleepLock shows both
// sides of the trigger's choice. TestSleepingReaderMissesNoCommit gives a
// reader whose PollInterval is an hour 300 rounds of a burst of commits
// and then one to four more within 3 ms, around its going to sleep, and
// each round must arrive in full; it fails when the read after taking the
// lock is left out, or when a refused lock waits for PollInterval.
//
// What it costs: awake, a writing statement takes one advisory lock and
// sends nothing, so under load writers no longer serialize; the WAL reader
// never holds the lock, so with it writers never notify. Going to sleep
// costs the reader two statements and waking one. A writing transaction
// left open (or prepared) keeps the reader from sleeping: it then reads
// every 16 ms until that transaction ends. So does a second reader of the
// same outbox holding the lock, such as a paused former leader, until its
// session ends. An application advisory lock that happened to use the same
// 64-bit key would do the same, or wake the reader for nothing; neither
// loses an event. A relay from before migration 013 never takes the lock,
// so while one leads, events wait for its PollInterval.
//
// The reader's connection runs with enable_seqscan off: the outbox is a
// queue whose statistics describe a passing moment (nearly empty when first
// analyzed, full of deleted rows before a vacuum), and the generic plan a
// prepared statement keeps for the connection's life, made from such
// statistics, scanned the whole table several times per live read. Every
// statement here is meant as an index lookup or an index-ordered scan.
// It also runs with jit off: with sequential scans priced out, a plan that
// sorts a whole batch by commit timestamp is costed above every JIT
// threshold, and the server spent 0.9 s compiling each such read (seen with
// auto_explain as the one-second stall of the commit-timestamp mode's live
// p99 in relay bench).
//
// A read of a live batch is one statement: it takes the snapshot, reads the
// rows whose transactions started since the previous tick or were running
// in it (through the (txid, id) index), records the tick when there are
// rows and prunes acknowledged ticks; a non-empty tick costs a row in
// poll_ticks and a transaction id (an empty one neither). A large batch (a backlog, the first
// batch after a start) is read in row-id order along the primary key, a
// page at a time; in commit-timestamp order its row ids are listed once,
// sorted, and then read a page at a time by id.
//
// Logical messages of <schema>.emit_message are invisible to SQL reads:
// Start refuses (ErrLogicalMessages) while a WAL-reader slot of this
// outbox that carried messages exists, and emit_message refuses to write
// once the poll reader recorded the progress (see cdc/).
//
// The poller never deletes outbox rows: the core does, after the sink has
// made the events durable, in the transaction that saves the checkpoint.
//
// # Memory
//
// Every read measures its rows in SQL: a row's size is the octet_length of
// its key, payload and headers (as JSON text), which for a TOASTed value
// reads only its length word. A row larger than Config.MaxMessageBytes
// comes back without payload and headers (and without its key unless the
// key alone is within the limit: the dead-letter policy holds by key), with
// relay.Event.TooLarge set to its size: the core dead-letters it by copying the row in SQL, so
// the relay never holds it (a 50 MiB row costs the relay its id). A page
// holds Config.PageBytes of loaded rows at most, beside its row limit: the
// poller sums the sizes as the rows arrive and keeps none from the row that
// would go above the budget on, except that the first row loaded always
// comes, alone when it is larger; the rest of the page is read and dropped
// a row at a time, and the next pages ask for fewer rows while rows are
// large (so at most one row beyond the budget is held, briefly). In
// commit-timestamp order a large batch's id list carries the sizes and each
// page takes its ids by the same rule.
// The bound counts headers as their JSON text, so a row with many headers
// close to the message limit is dead-lettered a few bytes earlier than the
// core's own check (which counts header names and values) would; a row
// within it is loaded and the core's check decides. Tested by
// TestPagesBoundedByBytes (both orders) and, with the relay binary under a
// memory limit, TestLargeEventsWithinMemoryLimit.
package poller
