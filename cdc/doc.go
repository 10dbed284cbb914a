// Package cdc reads the outbox from the write-ahead log: the WAL reader, a
// relay.Source that streams the inserts of <schema>.events, and the
// logical messages of <schema>.emit_message, through logical replication
// (the pgoutput plugin, protocol version 2 with streaming from PostgreSQL
// 14 on, 1 before, read with github.com/jackc/pglogrepl).
//
// The SQL statements it runs on ordinary connections (the preflight and
// the publication, the slots' state, drops and count, the slot creation
// records in <schema>.cdc_slots, the snapshot import and the table read
// after a slot's creation, the lag and the heartbeat) are in relay/store
// (store.CDCReader, one method each, with conformance tests); the
// replication commands (IDENTIFY_SYSTEM, CREATE_REPLICATION_SLOT,
// START_REPLICATION), the stream, and which statements run when (and so
// the faults survived, below) are here.
//
// # Setup and preflight
//
// Start checks, each failure with its own error and a message that says
// how to fix it: wal_level is logical (ErrWALLevel); the role has
// REPLICATION or is a superuser (ErrReplicationPrivilege); the outbox table
// exists (ErrNoOutbox); the publication, created when missing as
// "FOR TABLE <schema>.events WITH (publish = 'insert')", publishes that
// table's inserts (ErrPublication); a slot can be created when one is
// needed (ErrNoFreeSlot); and the permanent slot is not streamed by
// another process. In that last case Start returns a *SlotActiveError
// (errors.Is(err, ErrSlotActive)) at once rather than waiting: the caller
// is a standby and starts again later, as the relay core does after every
// failed start. A running source that finds its slot busy on reconnecting
// (usually its own previous walsender, not yet gone) retries for
// Config.SlotBusyTimeout before failing.
//
// # Slot and publication names
//
// Slots are named per cluster, publications per database. Without
// Config.SlotName the slot is "relay_<schema>_<database oid>", so outboxes
// in several databases of one cluster each get their own; but when a slot
// named "relay_<schema>" (the default of earlier relays) exists in this
// database, that one is used, so an upgraded relay keeps its slot and
// position. The choice is made once, on the first connection, and logged
// when it is the earlier name. The publication defaults to
// "relay_<schema>". TestE2ETwoDatabasesDefaultSlotNames runs two
// databases' relays at once, one of them on a kept earlier-named slot.
//
// # Positions and order
//
// The server sends each transaction whole, between BEGIN and COMMIT, when
// it commits, in commit order. An event's position is (commit LSN of its
// transaction, index of the event among the transaction's outbox inserts).
// The commit LSN is where the commit record starts (BEGIN's final_lsn, the
// same as COMMIT's commit_lsn), known at BEGIN, so a large transaction
// flows through a bounded queue (Config.QueueSize events, Config.QueueBytes
// bytes of keys, payloads and headers; a single larger event is queued
// alone) instead of being held in memory whole; its end LSN is remembered at COMMIT for confirming.
// Positions strictly increase in delivery order. Next returns whole
// transactions while they fit in max, and splits only a transaction larger
// than max (or one that fills the queue), with consecutive positions.
// Columns are mapped by name from the relation message; values are decoded
// by type from text or binary tuple data.
//
// # Decoding inserts
//
// The publication sends inserts only, and an insert is the event as it
// committed: outbox rows are immutable (migration 011 refuses UPDATE,
// DELETE and TRUNCATE of the table except in the core's fenced
// acknowledgement), so no later change in the writing transaction can
// make the row that committed differ from the insert logged, and the
// polling reader, which reads the row, publishes the same event. Inserts
// undone by a rolled-back savepoint are never sent (the server drops an
// aborted subtransaction's changes). TestImmutableRows (internal/contract)
// checks both readers.
//
// From PostgreSQL 14 on, the reader asks pgoutput for values in binary
// format (the "binary" option): the walsender then skips the types' output
// functions (hex for bytea, date formatting) and sends bytea at half the
// size, and the relay spends less decoding them. Earlier servers send
// text, which is read as well.
//
// Inserts are read straight from the message bytes, not through
// pglogrepl's tuples and pgtype (which allocate per column and per value):
// the seven columns the relay uses are parsed by strict parsers of the
// forms the server prints (int8, canonical uuid, ISO timestamptz, hex
// bytea, json text, or their binary forms), and each event's bytes are
// copied into one allocation, because events outlive the receive buffer.
// A value in another form (a year past 9999, a 'Z' offset, escape-format
// bytea) or a column of another type than the migrations' sends the
// message through pglogrepl and pgtype, which decode (or refuse) it as
// they did before. Infinite and BC creation times are errors. Every other
// message (BEGIN, COMMIT, RELATION, logical messages) goes through
// pglogrepl.
//
// # Reading the stream
//
// The walsender sends each pgoutput message with its own send. A reader
// faster than it would wake for every few messages, read a few hundred
// bytes and wait again. Inside a large transaction (64 events received,
// or a streamed chunk), whose events are delivered only at its commit, a
// read that found less than 64 KiB makes the next one wait 500 us first,
// so one read takes what arrived meanwhile (status.go, pacer). Smaller
// transactions, and everything between transactions, are read as they
// arrive; a large transaction's commit is seen at most about 500 us
// later. The pause changes only when bytes are read, not which bytes or
// what is done with them: positions, confirmation and the faults below
// are unchanged. TestPacerWaitsAfterShortReadsInBulk checks that the
// data read is the same.
//
// # Logical messages (the tableless outbox)
//
// <schema>.emit_message (migration 012) writes an event as a transactional
// logical message with the prefix relay:"<schema>": metadata as JSON
// (event id, topic, key, headers, creation time, tombstone), a zero byte,
// the payload. The reader asks pgoutput for messages and queues each of
// its prefix as an event at the next position of its transaction, the
// counter inserts use, so rows and messages of one transaction keep their
// order (message.go). Such an event has no row: its ID is the negated LSN
// of the message (relay.Event.HasRow), so the core deletes and archives
// nothing for it. Faults:
//
//   - Kill, reconnect, server restart: as for inserts. The slot sends
//     again what was not confirmed, the position filter drops what was
//     queued, and the event id, part of the WAL record, is the same in
//     every re-delivery, so the embedded sink's identity check holds
//     (TestEmitMessage, internal/contract, SIGKILLs a loaded relay).
//   - Slot dropped or invalidated: rows are recovered from the table,
//     messages cannot be. Unpublished messages are lost with the slot;
//     emit_message refuses new ones until the slot is recreated.
//   - A message that does not parse (written by hand with the prefix)
//     becomes an event with a topic saying so, which the core
//     dead-letters with the content as payload; the stream goes on.
//   - Switching readers: emit_message refuses once the poll reader
//     recorded the progress, and the poll reader refuses to start while
//     a slot that carried messages exists (cdc_slots.messages).
//
// # Streamed transactions
//
// With protocol version 1 the server decodes a transaction only when it
// commits: until then it holds all of it in its reorder buffer, in memory
// up to logical_decoding_work_mem and in spill files on its disk beyond,
// so a transaction of millions of rows costs the server that much and
// arrives all at once at its end. From PostgreSQL 14 on the reader asks
// for protocol version 2 with "streaming 'on'" (Config.NoStreaming, the
// run flag --cdc-streaming=false, keeps version 1; an older server gets
// version 1 and a log line saying so). The server then sends a
// transaction that outgrows logical_decoding_work_mem while it runs, in
// chunks between Stream Start and Stream Stop, each change tagged with the
// xid of its subtransaction, interleaved with other transactions' chunks
// and with transactions sent whole, and ends it with Stream Commit or
// Stream Abort (streamtx.go).
//
// The reader decodes each chunk's outbox events as they arrive and keeps
// them per top-level xid; nothing of a streamed transaction is queued
// before its Stream Commit. At Stream Commit its events are queued at
// (commit LSN, index), exactly the positions and the order the same
// transaction sent whole gets: the chunks together are its changes in WAL
// order, less those of aborted subtransactions, which is what the server
// sends of it whole. Events, identities, deduplication and checkpoints are
// therefore those of protocol version 1, whichever way a transaction
// arrives, in any session. Stream Abort of the top-level xid drops the
// transaction; of a subtransaction (ROLLBACK TO SAVEPOINT), it drops the
// events from that subtransaction's first message on: subtransactions
// nest, so everything after it until its abort is its own or its
// children's, which are aborted with it (PostgreSQL's own apply worker
// does the same). The events of all open streamed transactions together
// are held in memory up to Config.StreamMemoryBytes; beyond it the
// largest are appended to one spill file per transaction in
// Config.SpillDir, read back at commit, and removed at commit or abort.
// The bounded queue downstream of the commit works as for any
// transaction, so the relay's memory is the two bounds, whatever the
// transaction's size.
//
// Faults, and how they are survived:
//
//   - Process killed mid-stream, or between Stream Commit and the
//     acknowledgement of its events: the events were in memory, the spill
//     file, or the queue, none of it confirmed. The slot's restart_lsn is
//     held back by the open transaction (the server keeps WAL from its
//     first record), and its commit lies past confirmed_flush_lsn, so the
//     server decodes it again from the start and sends it again, streamed
//     or whole, at the same positions; what the core already published is
//     skipped by position and by the sink's identity check, as after any
//     kill. TestE2EStreamedCrashLoop SIGKILLs the relay while 64 kB
//     transactions stream.
//   - Connection lost or server restarted mid-stream: the session ends,
//     its streamed transactions and spill files are dropped (a new session
//     gets them again from their first chunk), and the reconnect resumes
//     as above. A Stream Start marked as a first segment for an xid held
//     already starts it over. TestE2EPostgresRestartWhileStreaming
//     restarts PostgreSQL twice while writers' transactions stream.
//   - Leftover or torn spill files at restart: never read. Spill files
//     live only within the session that wrote them; a new session, once
//     it holds the slot (so never a standby's), removes every spill file
//     in the directory before reading. A torn file is therefore only
//     garbage; a file that reads back short within its own session (the
//     disk failing under it) fails the session like a full disk does.
//   - Disk full, or the spill directory unusable, while spilling: the
//     session ends with the spill error, its files are removed, and the
//     reader reconnects with protocol version 1 for as long as the source
//     runs, logging the switch at error level: the server then holds the
//     large transactions again, and nothing is lost or published twice,
//     since nothing of the failed transaction was queued.
//     TestStreamingSpillFailureFallsBack points the spill directory at a
//     path that cannot be made.
//   - Abort of a subtransaction: its events, and those of the
//     subtransactions under it, are cut from memory or truncated from the
//     spill file at its first event's offset; the rest of the transaction
//     is published at commit with positions counted without them.
//     TestStreamedSubtransactionAbort rolls back savepoints.
//   - Abort of the transaction: dropped, file removed, nothing queued.
//
// Confirmation with open streamed transactions: the flush position does
// not move to the server's reported position while any streamed
// transaction is open (received in part, not yet committed or aborted),
// so nothing past such a transaction's changes is confirmed on the idle
// path. Transactions that commit while it is open are confirmed past, as
// with protocol version 1 (where the open transaction is invisible to the
// relay): their end LSN may lie past the open transaction's first
// changes, which is safe because the server sends whole every
// transaction whose commit is past confirmed_flush_lsn, decoding from
// restart_lsn, and does not resume streaming a transaction part way
// (ReorderBufferCanStartStreaming waits until decoding is past
// confirmed_flush_lsn). TestNoConfirmPastOpenStreamedTransaction checks
// that heartbeats do not move the flush position past an open one.
//
// # What is confirmed when
//
// The flush position of standby status updates, which becomes the slot's
// confirmed_flush_lsn, moves only in two ways:
//
//   - Past a transaction once Acked has covered its last event, to the
//     transaction's end LSN. The core calls Acked only after the sink made
//     the events durable and the checkpoint (with the deletion of the
//     published rows) committed. A partly acknowledged transaction holds
//     the flush position before it.
//   - To the server's reported position (keepalive WAL end, or the LSN of a
//     non-transactional logical message) when nothing is pending: every
//     received transaction acknowledged, none half received, nothing
//     queued. The server has sent everything that committed before that
//     position, and all of it is acknowledged, so an idle outbox does not
//     pin WAL. A heartbeat (pg_logical_emit_message, non-transactional,
//     every Config.HeartbeatInterval) keeps such positions coming while
//     other tables are busy.
//
// Nothing is confirmed on receipt. Status updates go out at least every
// Config.StatusInterval, right after the flush position moves, and when a
// keepalive asks for a reply; while the queue is full the reader stops
// reading but keeps sending them.
//
// # Restarts, reconnects, no loss and no duplicates
//
// Start(from) is given the core's last recorded position; START_REPLICATION
// asks for 0/0, which the server reads as the slot's confirmed_flush_lsn.
// Everything after that position was not confirmed, so the server sends it
// again; what it sends at or before from (confirmed too little, say after a
// crash) is skipped by position. A lost connection or a restarted server is
// retried with exponential backoff (up to Config.MaxBackoff); a new session
// resumes the same way, skipping what was already queued, including the
// first part of a transaction cut in the middle. No event is lost because
// the slot is never confirmed past an unacknowledged event; none is
// delivered twice because of the position filter (the core filters again).
//
// # Slot creation and slot loss
//
// A slot only streams transactions that commit after its consistent point,
// so every slot creation goes with a read of the table, which holds exactly
// the events not yet acknowledged (the core deletes rows only once they
// are published). CREATE_REPLICATION_SLOT ... EXPORT_SNAPSHOT returns the
// consistent point C and a snapshot in which exactly the transactions that
// committed before C are visible. The reader imports it once to learn its
// xmin, xmax and running transactions (pg_current_snapshot()) and records
// C and that snapshot in <schema>.cdc_slots. The rows to read from the
// table are then those whose txid is visible in the recorded snapshot
// (pg_visible_in_snapshot): they committed before C, so the slot will
// never send them, and every row it will send is invisible there. Neither
// overlap nor gap. They are queued in (txid, id) order at positions
// (C - 1, n), above everything earlier slots delivered (their commit
// records all end at or before C) and below everything the new slot
// streams (commits at or after C).
//
// The record is written in two steps: without position before the slot is
// created, completed after. A record left incomplete by a crash makes the
// next Start create the slot again. A complete record survives until its
// rows are acknowledged, so a restart in the middle of the table read reads
// the rows still present (the acknowledged ones are deleted) and numbers
// them after from; a new slot would be found healthy and could not tell
// these rows apart without it.
//
// Once the rows are acknowledged the snapshot is cleared and the record
// stays: a slot of the configured name without a record was not created
// this way (say, by hand), so Start replaces it too.
//
// This covers the first start (rows written before the relay ran), a slot
// dropped or invalidated (wal_status = 'lost', max_slot_wal_keep_size
// exceeded) while the relay was down, and one lost while it runs. The
// loss is logged at error level. While running, the reader drops its
// queued events, waits until the core acknowledged every event Next
// already returned (so the table holds exactly the rest), and then
// recreates the slot and reads the table as above.
//
// # Failover slots
//
// On PostgreSQL 17 and later the slot is created with the failover
// property (CREATE_REPLICATION_SLOT ... (SNAPSHOT 'export', FAILOVER
// true); Config.NoFailoverSlot turns it off), and Start gives an existing
// slot without the property that property (ALTER_REPLICATION_SLOT, while
// the slot is not streamed; a failure is logged and the slot used as it
// is: TestFailoverStateWithoutStandby, internal/pgmajors). A physical
// standby with
// sync_replication_slots = on, hot_standby_feedback = on, a physical slot
// (primary_slot_name) and a dbname in primary_conninfo then keeps a
// synchronized copy of it; with synchronized_standby_slots naming that
// physical slot on the primary, the primary's walsender sends the relay
// nothing the standby has not confirmed, so the copy's position is never
// ahead of the WAL the standby has. Faults:
//
//   - Primary lost, standby promoted, the relay's connections pointed at
//     it: the reader reconnects to the same slot name, finds the copy and
//     its record in <schema>.cdc_slots (replicated like every table) and
//     streams on. The copy may be behind what the relay acknowledged on
//     the old primary (synchronization runs every few seconds): what it
//     sends again is at or below the acknowledged position and dropped,
//     as after a reconnect; what the relay published but whose
//     acknowledgement the standby never received is recognised by the
//     sink as after a SIGKILL between the two acknowledgements. No table
//     read, no loss, no duplicate: TestFailoverSlotSurvivesPromotion
//     (internal/pgmajors) promotes a standby under load.
//   - Without a synchronized copy (no failover property, no
//     sync_replication_slots, a standby that never caught up with the
//     slot, PostgreSQL 16 or earlier) the promoted server has no slot:
//     the reader recreates it and reads the table, as for a dropped slot
//     above (no loss; events the old slot had sent and the relay
//     published but did not acknowledge are recognised by the sink).
//   - Events committed on the old primary that never reached the standby
//     are lost with it (asynchronous replication): no relay can publish
//     them. synchronized_standby_slots only keeps the relay from
//     publishing events the standby does not have.
//
// SlotFailoverState reads whether a promotion would find the slot (the
// failover property and synchronized_standby_slots with all its standbys
// streaming on a primary; the synced copy on a standby), and
// Source.Warnings reports it in the relay's /readyz as a warning, which
// does not make the relay unready; Start logs it at warning level.
package cdc
