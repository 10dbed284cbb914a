// Package relay is the pipeline between an outbox reader and a log.
//
// A Source (poller/ or cdc/) delivers committed outbox events in commit
// order. The core validates and routes each one into a Message (topic, key,
// headers plus the event id), hands batches to a Sink (the embedded broker or
// Kafka), and once the sink reports them durable, it acknowledges them in one
// Postgres transaction: the published rows are deleted (or archived) and the
// source position and the sink's state are saved together. Only after that
// commit does the source learn the events are done (the WAL reader then
// advances its slot). Events that can never be published go to the
// dead-letter table in the same transaction; under the hold-key policy the
// later events of their key follow them there, held, until the leader
// releases them in order after a retry or discard (fault model in hold.go
// and release.go). Readiness is end to end: the leader's heartbeat rows go
// the same way and /readyz fails when none got through within the bound
// (heartbeat.go). An event a source delivered without its content (too
// large, Event.TooLarge) is copied to the dead letters from its outbox row
// in SQL, before the row's deletion, so a crash before the commit leaves
// the row to be read and dead-lettered again, and a commit records it
// exactly once (oversize.go). Memory is bounded by a byte budget as well as
// rows (budget.go). With a Validator (internal/registry), routing also
// checks each payload against its topic's schema contract: one that breaks
// it is a route error like the others (ReasonSchemaInvalid); a validator
// that cannot read its contracts fails the pipeline instead (route.go).
// With CloudEvents configured, routing then presents the message as a
// CloudEvent of its topic's mode; a payload structured mode cannot wrap is
// a route error too (ReasonNotWrappable), dead-lettered like the others:
// routing is a pure function of the event, so a crash or a replay routes
// it the same way again (cloudevents.go).
//
// # Starting
//
// Run first checks that the schema is at this binary's version. A
// database behind it (migrations pending) or ahead of it beyond the
// compatibility range the newer migrations recorded (migrations' package
// comment; docs/upgrading.md) ends Run with that error: the operator must
// act. So does a refusal that asking again will not change
// (pgconfig.Refused: the login refused, no such database, a missing
// privilege; TestStartupRefusedExits). A database ahead within that range,
// during a rolling upgrade, is logged as a warning and run on
// (TestNewerSchemaWithinRange in internal/upgrade). Any other
// failure of the check (the connection refused or lost, the server
// restarting) is not an answer: the relay logs it and asks again with the
// leader loop's backoff, until it gets one or is stopped, so a relay
// started before or while its database restarts does not exit
// (TestStartupSurvivesALostConnection terminates the check's session
// while it waits on a lock).
//
// Each session of the pipeline starts the source, then the sink, and
// reads the source's first page while the sink starts (prefetch in
// pipeline.go): after a restart that read is mostly the database's work
// and the embedded sink's start is the broker's open, so each takes a
// core. Nothing reaches the sink before its Start returned; the page
// waits. Faults: the sink's start fails, or the lease is lost meanwhile:
// the read is cancelled and has returned before the source is closed and
// before the next session starts its own (TestSourceReadsWhileSinkStarts,
// whose source reports a read that outlived its session). The process
// killed meanwhile: nothing was handed on or acknowledged, so the next
// leader reads the page again from the checkpoint.
//
// # Where the SQL lives
//
// Every statement the core runs (leadership, checkpoint, the
// acknowledgement's deletes, archive moves and dead letters, holds and
// releases, heartbeat, backlog, retention and replay) and those of the
// operator commands on dead letters and replays are in package
// relay/store, behind the storage interface (storage.go), which lists
// them in one place (the readers' are there too, in store.PollReader
// and store.CDCReader). The transactions stay here: which statements commit
// together, and so what survives a crash, is decided by ack.go,
// leadership.go, release.go and replayer.go; relay/store's conformance
// tests check each statement's effect against PostgreSQL.
//
// # Waiting for the destination
//
// A sink tells a refusal of the event (PublishResult.Failed: dead letter)
// from a refusal by the destination for now (a DestinationError: a topic
// that does not exist yet, a missing ACL, a throttled creation). For the
// latter the publishing stage offers the same batch again every second
// (publishWaiting) and takes nothing else meanwhile, so the whole
// pipeline waits behind it. Faults and how they are met:
//
//   - Per-key order: nothing behind the refused batch is handed to the
//     sink before it, so no key's later event overtakes an earlier one.
//     Batches already in flight before it complete and are acknowledged
//     as usual: they precede it.
//   - Nothing unpublished leaves the outbox: the refused batch never
//     reaches the acknowledging stage until the sink took it and made it
//     durable, so its rows stay (TestE2EKafkaMissingTopic and
//     TestEmbeddedMissingTopic watch the oldest row stay through a 32 s
//     wait, with writers committing).
//   - Nothing twice: a sink returns DestinationError only when the same
//     batch can be published again without repeats (it wrote nothing of
//     it, or it remembers what of it is durable: the Kafka sink in the
//     at-least-once mode; TestTopicAuthorization).
//   - No refusal is cached: the sink is asked again at every offer, so the
//     batch goes as soon as the topic exists (within about a second).
//   - A graceful stop during the wait ends it at once; the batch stays in
//     the outbox. A lost lease or a hard stop ends it too, and the next
//     session offers the events again from the source.
//   - Crash during the wait: the rows are in the outbox; nothing else
//     happened.
//   - A replay chunk naming a refused topic waits like a live batch (the
//     live events behind it wait too); cancelling the replay does not end
//     a wait already begun, creating the topic (or stopping the relay)
//     does.
//
// The wait is loud: Ready (and /readyz) fails naming each topic and the
// reason, relay_destination_waiting_since_timestamp_seconds has a sample
// per topic, and one warning is logged when a topic is first refused, then
// one per 30 s.
//
// # Tracing
//
// With Config.Tracer set, each batch's spans (trace.go) are made once the
// sink reported it durable, on the goroutine that waits for durability,
// before its acknowledgement is passed on; they are handed to the SDK,
// whose processor drops rather than blocks (internal/tracing's fault
// model). So tracing cannot fail a batch, and a collector that is down or
// stuck delays nothing (TestTracingNeverHoldsPublication in internal/cli).
// The sink is asked for each message's placement (Session.Placements)
// only while tracing. Without a tracer the path is unchanged but for nil
// checks.
package relay
