// Package faults holds the fault-injection acceptance tests of the relay's
// exactly-once guarantee and of its fenced leadership (issue 13). Each test
// runs the real binary against a real PostgreSQL, injects one kind of
// fault while writers commit events, and reads the whole log back to count
// lost, duplicated and reordered events:
//
//   - the leader's lease session killed (pg_terminate_backend), alone or
//     with all its other sessions, with a standby on the same data
//     directory, also while a `relay replay` runs, and with the Kafka sink
//     (at least once, and never two relays' producers interleaved in a
//     partition);
//   - the leader cut off from PostgreSQL by a silent network partition
//     (a TCP proxy that stops forwarding), and then healed;
//   - the leader paused with SIGSTOP past its lease, then resumed;
//   - the WAL reader's slot dropped while the relay is down with
//     published but unacknowledged events;
//   - outbox rows deleted by an operator between publish and
//     acknowledgement, then SIGKILL;
//   - a Kafka client producing under the relay's own producer id;
//   - every connection between relay and PostgreSQL cut every few seconds
//     for two minutes, with either reader;
//   - SIGKILLs while poison events hold three keys under the hold-key
//     dead-letter policy, and during their release after retry and
//     discard (the log must have each key's events in order, none of a
//     held key published before its release);
//   - a share group member and then the relay SIGKILLed while two
//     members consume the outbox's events through the Kafka listener,
//     accepting, releasing and rejecting them (every event accepted or
//     dead-lettered as it should be, none delivered again after its
//     acknowledgement was answered).
//
// The package has no non-test code besides this comment; the helpers it
// uses (the fault proxy, writers, the log checker) are in internal/e2e.
package faults
