// Package protocol serves the Kafka wire protocol over the embedded broker
// (internal/broker), so that ordinary Kafka clients (franz-go, librdkafka
// and kcat, sarama, ...) produce to and consume from the relay's log.
//
// # Use
//
//	srv, err := protocol.NewServer(b, protocol.Config{AdvertisedAddr: "host:9092"})
//	ln, err := net.Listen("tcp", "127.0.0.1:9092")
//	err = srv.Serve(ctx, ln) // returns nil once ctx ends, connections closed
//	srv.Close()              // before closing the broker
//
// The server is one node (broker id 0) that leads every partition and
// coordinates every group. Without an advertised address it tells each
// client the local address of the connection the client came in on.
//
// # APIs and versions
//
// Requests and responses are franz-go kmsg types. ApiVersions advertises
// exactly these ranges:
//
//	Produce 3-9          Fetch 4-12            ListOffsets 1-10
//	Metadata 0-12        OffsetCommit 0-9      OffsetFetch 0-8
//	FindCoordinator 0-4  JoinGroup 0-9         Heartbeat 0-4
//	LeaveGroup 0-5       SyncGroup 0-5         DescribeGroups 0-5
//	ListGroups 0-5       ApiVersions 0-3       CreateTopics 0-7
//	InitProducerId 0-4   SaslHandshake 0-1     SaslAuthenticate 0-2
//	DescribeAcls 0-3     CreateAcls 0-3        DeleteAcls 0-3
//	DescribeConfigs 0-4  AlterConfigs 0-2      IncrementalAlterConfigs 0-1
//	CreatePartitions 0-3 DeleteTopics 0-6      DeleteRecords 0-2
//	DescribeLogDirs 0-4  DescribeCluster 0-2   DeleteGroups 0-3
//	OffsetDelete 0
//	AddPartitionsToTxn 0-3  AddOffsetsToTxn 0-3  EndTxn 0-3
//	TxnOffsetCommit 0-3  DescribeTransactions 0  ListTransactions 0-1
//	ConsumerGroupHeartbeat 0-1  ConsumerGroupDescribe 0-1
//
// Topic configs (topic_config.go) are those the broker keeps:
// cleanup.policy (a list: delete, compact or both), retention.ms,
// retention.bytes, segment.bytes, segment.ms, delete.retention.ms,
// min.compaction.lag.ms and max.message.bytes. DescribeConfigs
// reports one equal to the broker's default with the default source, any
// other as a topic config; alterations are durable (meta.json) before they
// answer, and a partition count is never changed by them: only
// CreatePartitions raises it: when it moves no key in the log at once,
// otherwise only when Config.AllowRepartition says so, answering with the
// count of keys that would move. Altering the
// configs of a topic the relay publishes needs an ACL that allows it, as
// writing to it does (see Authorization).
//
// An ApiVersions request above v3 gets UNSUPPORTED_VERSION in the v0
// format with the supported ranges, so the client retries lower. Any other
// key or version, a frame over Config.MaxFrameBytes or one that does not
// decode closes that connection; other connections are unaffected.
// OffsetForLeaderEpoch is deliberately not offered, so clients do not
// validate positions against leader epochs (the leader epoch is always 0).
// The repository's docs/kafka-compatibility.md lists every API with its versions
// and what is refused by design.
//
// # Produce and fetch
//
// Produce appends each partition's record batch v2 through
// broker.AppendAsync, as sent (compressed batches stay compressed). acks 1
// and -1 are answered after the broker's sync policy made every batch of
// the request durable (under SyncBeforeAck one fsync of the broker's
// journal covers all its partitions); acks 0 gets no response. A
// connection's responses are written by a writer goroutine in request
// order, so while one produce request waits for its fsync the next one is
// already appended: an idempotent producer's five in-flight requests share
// fsyncs, and each partition still sees the batches in the order they were
// sent. Idempotent producers get ids from InitProducerId; the broker
// deduplicates and orders their batches.
//
// Fetch serves the stored batches byte for byte, bounded by each
// partition's and the response's max bytes except that the first batch is
// always returned whole. It long-polls on the partitions' high watermarks
// until MinBytes are there or MaxWaitMillis passes. Fetch sessions
// (KIP-227) are kept as Kafka keeps them, in a cache of
// Config.FetchSessionCacheSlots with Kafka's eviction rules
// (fetch_session.go): an incremental fetch lists only the partitions whose
// position changed and is answered only with those that have something
// new.
// ListOffsets answers earliest, latest, by timestamp, max timestamp (-3),
// earliest-local (-4) and latest-tiered (-5), the last two as a broker
// without tiered storage does (02_list_offsets.go). read_uncommitted reads to the high watermark, which only
// advances over durable data; read_committed to the last stable offset
// (see Transactions).
//
// # Transactions
//
// The server is the transaction coordinator of every transactional id
// (FindCoordinator answers this node for key type 1); the coordinator
// itself, its durable state and its fault model are the broker's (see
// internal/broker, "Transactions"). InitProducerId with a transactional id
// bumps the id's epoch, fencing older producers, and aborts what they left
// open; AddPartitionsToTxn, AddOffsetsToTxn, TxnOffsetCommit and EndTxn
// answer once their state change is durable, EndTxn once the markers are
// durable in every partition of the transaction. A Produce request with a
// transactional id (acks must be -1) is appended only for the current
// epoch of an Ongoing transaction that added the partition; a fenced
// producer gets INVALID_PRODUCER_EPOCH, the other requests PRODUCER_FENCED
// (INVALID_PRODUCER_EPOCH before the versions that know it). A Fetch or
// ListOffsets at read_committed stops at the last stable offset, and
// Fetch lists the aborted transactions among the batches it returns, which
// the client skips with the control batches. OffsetFetch with
// require_stable answers UNSTABLE_OFFSET_COMMIT while a transaction holds
// offsets of the partition that are not committed yet; TxnOffsetCommit v3
// checks the member and generation like OffsetCommit (KIP-447), so a
// zombie of an old generation cannot commit. DescribeTransactions and
// ListTransactions report the coordinator's state. WriteTxnMarkers is not
// offered: the single node writes its own markers.
//
// franz-go's own transaction test passes against the broker: serve one
// (this package's test binary does with RELAY_PROTOCOL_TEST_ROLE=broker,
// RELAY_PROTOCOL_TEST_DIR and RELAY_PROTOCOL_TEST_ADDR set), then in
// franz-go's pkg/kgo run KGO_SEEDS=addr KGO_TEST_RF=1 go test -run
// 'TestTxnEtl|TestGroupETL' (with KGO_TEST_UNSAFE too). TestFranzGoSuite
// runs that package's whole suite so, its KIP-848 variants included, and
// lists the one test expected to fail and why (franzGoExpectedFailures).
//
// # Groups
//
// Both group protocols are served: the classic one (JoinGroup, SyncGroup,
// Heartbeat, LeaveGroup), below, and KIP-848's (ConsumerGroupHeartbeat,
// ConsumerGroupDescribe), where the coordinator assigns with the uniform
// or range assignor and a partition moves to a new member only after its
// previous owner acknowledged revoking it (consumer_group.go has its
// rules and fault model). A group id is one or the other while it has
// members; both are saved with the offsets and restored at start.
//
// The classic group protocol runs as Kafka's coordinator does, its last
// Stable or Empty membership saved in the broker beside the offsets and
// restored at start (groups_state.go), so a relay restart or takeover
// does not rebalance members that come back within their session timeout:
// Empty -> PreparingRebalance -> CompletingRebalance -> Stable. A join, a
// leave, a protocol change or a member's departure starts a rebalance;
// every member must rejoin within the largest rebalance timeout or is
// dropped; the leader (kept across generations while present) gets the
// members' metadata and the protocol most members prefer among those all
// support, and its SyncGroup hands out assignments. A member that does not
// heartbeat (or join, sync, or commit) within its session timeout is
// removed and its partitions are reassigned in a new generation; members
// that never SyncGroup within the rebalance timeout are dropped too. New
// dynamic members on JoinGroup v4+ first get MEMBER_ID_REQUIRED. Static
// members (group.instance.id) that rejoin under a new member id take over
// their old identity and assignment without a rebalance (unless their
// protocols changed or they lead), fencing the old id; they are still
// removed when their session expires. The first rebalance of an empty
// group waits Config.InitialRebalanceDelay for more members.
//
// Session timeouts must lie in [MinSessionTimeout, MaxSessionTimeout].
// Membership is saved as said above; committed offsets are durable: OffsetCommit writes through broker.CommitOffsets (one fsync per
// request), OffsetFetch reads broker.FetchOffset. A commit must name the
// member's current generation, except that a group with no members
// accepts standalone commits (generation -1).
//
// # Share groups
//
// Share groups (KIP-932: ShareGroupHeartbeat, ShareGroupDescribe,
// ShareFetch, ShareAcknowledge and the share group offsets APIs;
// share_group.go, share_partition.go, share_fetch.go, share_admin.go)
// give every member every partition of its topics; each record is
// acquired by one member at a time under a lock
// (share.record.lock.duration.ms), then accepted, released or rejected,
// delivered again after a release or a lock timeout, and archived after
// share.delivery.count.limit deliveries. Share sessions are kept per
// member; closing one, the member leaving or its session timing out
// releases what it holds. A group's configs are set by
// IncrementalAlterConfigs or AlterConfigs on the group resource, or by
// Server.ApplyShareGroupConfigs (the config file's share-groups, applied
// as a SET when the relay's listener starts and on SIGHUP);
// ValidateShareGroupConfig is the one check of a config's value for both.
//
// Fault model of the share state (share_state.go): each group's configs
// and share partitions (start and end offsets, in-flight records with
// their delivery counts) are one file replaced atomically and fsynced
// before the acknowledgement that changed it is answered, so a crash,
// SIGKILL or restart at any point loses no answered acknowledgement: an
// accepted or rejected record is not delivered again; a record acquired
// and not yet acknowledged is saved as available and delivered again
// after a restart (TestShareStateSurvivesRestart). Acquisitions alone are
// not written: a crash forgets delivery counts raised since the last
// write (a record may then be delivered more than
// share.delivery.count.limit times, never fewer than it was acknowledged).
// A record saved while acquired at the limit is archived at restore (and
// copied to the dead-letter topic), not delivered again
// (TestShareStateRestartArchivesAtTheLimit). With the relay binary, the
// outbox and a SIGKILLed member and relay: internal/faults
// TestShareGroupOverOutboxSurvivesMemberAndRelayKills.
// A failed write is logged; the change lasts in memory until the next
// write succeeds or the relay stops. Member ids, epochs and share
// sessions are not saved: after a restart members rejoin, as clients do
// on UNKNOWN_MEMBER_ID and SHARE_SESSION_NOT_FOUND.
//
// # Metrics
//
// GroupLags and Collector (a prometheus.Collector) report, per group, topic
// and partition, the lag (high watermark minus committed offset) and the
// margin against retention (committed offset minus log start offset), plus
// the member count of each live group. It includes StorageCollector: the
// broker's storage health (relay_broker_storage_healthy), its lost ranges
// (relay_broker_lost_records, relay_broker_lost_ranges, and per partition
// relay_broker_partition_lost_records and relay_broker_lost_range_records
// labelled with the first and last offset) and the background check's
// progress.
//
// # Storage errors
//
// A fetch of offsets the broker reports lost (broker.ErrDataLost) answers
// an error for that partition, never an empty set that would look like the
// end of the log: Config.LostDataErrorCode, CORRUPT_MESSAGE by default,
// which Java consumers raise to the application and franz-go surfaces with
// kgo.KeepRetryableFetchErrors (it retries retriable fetch errors quietly
// otherwise), or UNKNOWN_SERVER_ERROR, which franz-go surfaces by default.
// A produce while the broker's storage failed answers KAFKA_STORAGE_ERROR,
// which producers retry until the broker was reopened.
//
// # Security: TLS, SASL, ACLs
//
// Config.TLS makes the listener TLS-only (a client certificate, when
// required and verified, names the principal User:<common name>).
// Config.Users makes SASL mandatory: PLAIN, SCRAM-SHA-256 and
// SCRAM-SHA-512 (RFC 5802, checked against stored credentials: salt,
// iterations, StoredKey and ServerKey, never the password; see UsersFile),
// through SaslHandshake v1 and SaslAuthenticate or v0's unframed tokens.
// Config.Authorizer checks every request against Kafka-style ACLs (see
// authz.go for the operation each API needs); the relay's topics are
// read-only for clients unless an ACL allows writing them, and only super
// users or an explicit ACL may describe or change the ACLs. The zero
// Config has none of these and serves every client as before.
//
// # Threat model of the listener
//
// The listener is the one way into the relay's process that the relay does
// not control the other end of. What a hostile or buggy client can and
// cannot do, and the test that shows it:
//
//   - Without credentials, with SASL on: send ApiVersions and the SASL
//     requests only, in frames of at most 512 KiB, and only for
//     Config.HandshakeTimeout (TLS handshake included); any other request,
//     a larger frame or a slow handshake closes the connection
//     (TestSASLRequiredBeforeOtherRequests). It learns nothing from a
//     failure: every failed authentication gets the same message, whether
//     the user exists or not, and then the connection closes
//     (TestSASLOverTLSWithFranzGo, TestSASLOverTLSWithKcat). Passwords and
//     tokens are never logged; the user name is not logged either (people
//     type passwords into it) (TestSecuredListenerAndSecrets in
//     internal/cli greps every output for them).
//   - With credentials: only what the ACLs allow. It cannot write into
//     the relay's topics (TOPIC_AUTHORIZATION_FAILED), so every record a
//     consumer reads there came from the outbox and its relay-event-id
//     header is the relay's (TestACLsProduceToRelayTopicsRefused); it
//     cannot join, commit for or list a group an ACL reserves for others
//     (TestACLsGroupDeniesForeignGroup); it cannot grant itself rights
//     (TestACLAPIs). It cannot use a transactional id an ACL does not
//     let it write (TRANSACTIONAL_ID_AUTHORIZATION_FAILED), so it cannot
//     fence another client's producer or abort its transaction
//     (TestACLsTransactionalID), though under the default rule (allow)
//     an id no ACL names is anyone's; an idempotent InitProducerId is not
//     checked: an id alone writes nothing. Every API has an authorization
//     rule, and a request type without one closes the connection
//     (TestEveryAPIHasAnAuthorizationRule).
//   - Exhaust memory: no. Every request frame waits for its bytes of the
//     requests' half of Config.MaxInFlightBytes before it is read and
//     holds them until handled; a frame may be a quarter of the budget at
//     most; a fetch response holds what its batches took (at most a
//     quarter of the budget, plus one batch) of the responses' half until
//     written; a connection has at most one unwritten fetch response,
//     eight handled requests and eight decoded ones (TestInFlightBudget,
//     TestFetchAnsweredWhileRequestsHoldBudget; TestListenerFlood in
//     internal/cli floods a running relay with idle connections, 4 MiB
//     frames and slow readers
//     and shows the bytes in flight never pass the budget, the process's
//     peak RSS stays under its soft limit, and the relay keeps relaying).
//   - Exhaust connections or goroutines: only up to Config.MaxConnections
//     in all and Config.MaxConnectionsPerAddress from one address (by
//     default, as in Kafka, no per-address limit: 500 connections from
//     one address are served, TestDefaultLimitsServe500FromOneAddress);
//     more are closed as soon as accepted, counted and logged
//     (TestConnectionLimits, TestRefusalLogInterval). Idle
//     connections are closed after Config.IdleTimeout (TestIdleTimeout).
//   - Crash the process or corrupt the log: no. Frames that do not decode,
//     unknown keys and versions close that connection only (fuzz_test.go);
//     a panic in a handler is recovered and closes that connection; a
//     client's batches are validated by the broker before they are
//     appended (internal/broker).
//   - Slow down other clients: yes, within bounds. The budget is shared:
//     a client that trickles a frame (it needs only announce the size) or
//     stops reading its responses holds its share until Config.IOTimeout
//     (default 30s) closes it, and a few such connections can hold all of
//     the requests' or the responses' half, so that other clients wait
//     that long. A waiting large frame does not hold up smaller requests
//     that fit, and requests never keep fetch responses from their bytes
//     or the other way round. TestListenerFlood shows this:
//     its consumer read little while eight slow readers held the budget
//     and caught up after. The relay's own appends do not go through the
//     listener and are never slowed by it.
//   - Read the relay's topics: yes, by default (the default ACL rule is
//     allow; Config.Authorizer with DenyByDefault changes that).
//   - Create topics: yes, by default, and with its own configs: a client
//     that creates a topic before the relay first publishes to it chooses
//     its retention (a retention.ms of 1 would delete the relay's events
//     soon after they are written). Where clients are not trusted, deny by
//     default and allow Create only to the operator's principal.
//   - Without TLS, everything on the wire (records, PLAIN passwords) can
//     be read and changed by the network; SCRAM does not send the
//     password but does not protect the session either. The relay's CLI
//     refuses PLAIN without TLS.
package protocol
