package broker

import (
	"context"
	"errors"
	"fmt"

	"github.com/twmb/franz-go/pkg/kerr"
)

// Sentinel errors. Every error the broker returns for a client-visible
// condition wraps one of these, so callers test with errors.Is and the wire
// listener maps them with KafkaErrorCode.
var (
	// ErrCorruptBatch means the bytes are not a well-formed record batch
	// (lengths disagree, truncated records, undecodable compression).
	ErrCorruptBatch = errors.New("broker: corrupt record batch")
	// ErrInvalidCRC means the batch's CRC32C does not match its contents.
	// It wraps ErrCorruptBatch so either test matches.
	ErrInvalidCRC = &wrapped{msg: "broker: record batch CRC mismatch", parent: ErrCorruptBatch}
	// ErrUnsupportedMagic means the batch is not record batch v2.
	ErrUnsupportedMagic = errors.New("broker: unsupported record batch magic")
	// ErrMessageTooLarge means the batch exceeds the topic's max.message.bytes.
	ErrMessageTooLarge = errors.New("broker: record batch larger than max message bytes")
	// ErrInvalidTopic means the name breaks Kafka's topic naming rules.
	ErrInvalidTopic = errors.New("broker: invalid topic name")
	// ErrTopicExists is returned by CreateTopic for an existing topic.
	ErrTopicExists = errors.New("broker: topic already exists")
	// ErrInvalidConfig means a TopicConfig or Options value is out of range.
	ErrInvalidConfig = errors.New("broker: invalid configuration")
	// ErrInvalidPartitions means a partition count change the broker
	// refuses: fewer partitions (never), or more when not confirmed.
	ErrInvalidPartitions = errors.New("broker: invalid partition count")
	// ErrRecentlyDeleted means a topic of that name was deleted since the
	// broker opened, and its records may still be in the journal.
	ErrRecentlyDeleted = errors.New("broker: topic deleted since the broker opened")
	// ErrUnknownTopicOrPartition means the topic or partition does not exist.
	ErrUnknownTopicOrPartition = errors.New("broker: unknown topic or partition")
	// ErrOffsetOutOfRange means the offset is below the log start or above the
	// high watermark.
	ErrOffsetOutOfRange = errors.New("broker: offset out of range")
	// ErrDuplicateSequence is never returned by Append (a duplicate is an
	// acknowledged success carrying the original offset); it exists for
	// callers that want to name the condition, e.g. AppendResult.Err.
	ErrDuplicateSequence = errors.New("broker: duplicate sequence number")
	// ErrOutOfOrderSequence means the batch's sequence does not follow the
	// producer's last sequence on this partition.
	ErrOutOfOrderSequence = errors.New("broker: out of order sequence number")
	// ErrInvalidProducerEpoch means the batch carries an epoch older than the
	// producer's current one (a fenced producer).
	ErrInvalidProducerEpoch = errors.New("broker: invalid (stale) producer epoch")
	// ErrUnknownProducerID means a producer id the broker never allocated.
	ErrUnknownProducerID = errors.New("broker: unknown producer id")
	// ErrReservedProducerID means a client produced under a producer id the
	// broker reserved for its own writers (the relay's sink): only
	// InitInternalProducer's holder may append under it.
	ErrReservedProducerID = errors.New("broker: producer id reserved for the broker's own writers")
	// ErrKeylessCompacted means a record without a key was sent to a topic
	// with cleanup.policy=compact.
	ErrKeylessCompacted = errors.New("broker: compacted topic requires record keys")
	// ErrTransactionalUnsupported means a client sent a control batch
	// (only the coordinator writes markers), or a transactional batch
	// outside ProduceTxnAsync (without a transactional id).
	ErrTransactionalUnsupported = errors.New("broker: transactional batches are not supported")
	// ErrProducerFenced means a newer instance of the transactional id
	// (or the coordinator, aborting a timed-out transaction) bumped the
	// producer epoch: the caller is a zombie and may not continue.
	ErrProducerFenced = errors.New("broker: producer fenced by a newer epoch")
	// ErrInvalidProducerIDMapping means the producer id is not the one
	// the transactional id maps to.
	ErrInvalidProducerIDMapping = errors.New("broker: producer id does not match the transactional id")
	// ErrInvalidTxnState means the request does not fit the state of the
	// transaction (a transactional batch for a partition not added, an
	// EndTxn with no transaction, a commit of an aborted one).
	ErrInvalidTxnState = errors.New("broker: invalid transaction state")
	// ErrConcurrentTransactions means the previous transaction of the id
	// is still being completed; the client retries.
	ErrConcurrentTransactions = errors.New("broker: the previous transaction is still being completed")
	// ErrInvalidTransactionTimeout means transaction.timeout.ms is not
	// above zero or above the broker's maximum.
	ErrInvalidTransactionTimeout = errors.New("broker: invalid transaction timeout")
	// ErrUnknownTransactionalID means the id never initialised.
	ErrUnknownTransactionalID = errors.New("broker: unknown transactional id")
	// ErrClosed means the broker was closed.
	ErrClosed = errors.New("broker: closed")
	// ErrStorage means a write, fsync or read of the log failed; the append
	// was not acknowledged and the partition was rolled back to its last
	// durable state. It wraps the underlying I/O error as well.
	ErrStorage = errors.New("broker: storage error")
	// ErrUnknownGroup means no offsets were ever committed for the group.
	ErrUnknownGroup = errors.New("broker: unknown consumer group")
	// ErrStorageFailed means an fsync (or the truncation that has to follow
	// a failed write) failed earlier: the kernel may have dropped data the
	// broker had written, so nothing is acknowledged until the broker was
	// reopened from disk (Reopen, or the automatic reopen). Health returns
	// it. It wraps ErrStorage.
	ErrStorageFailed = &wrapped{msg: "broker: storage failed; the broker must be reopened from disk", parent: ErrStorage}
	// ErrDataLost means the requested offsets are in a range the broker
	// found damaged or missing and could not repair (PartitionInfo.Lost).
	// It wraps ErrCorruptBatch, so the listener answers CORRUPT_MESSAGE.
	ErrDataLost = &wrapped{msg: "broker: data lost", parent: ErrCorruptBatch}
	// ErrPartitionLost means a partition directory of a topic that
	// meta.json knows is missing; Open refuses unless
	// Options.AllowLostPartitions is set.
	ErrPartitionLost = errors.New("broker: partition directory missing")
)

// wrapped lets one sentinel match a broader one via errors.Is.
type wrapped struct {
	msg    string
	parent error
}

func (w *wrapped) Error() string { return w.msg }
func (w *wrapped) Unwrap() error { return w.parent }

// storageError carries both ErrStorage and the I/O cause so errors.Is works
// for either (e.g. syscall.ENOSPC).
type storageError struct {
	op    string
	cause error
}

func (e *storageError) Error() string {
	return "broker: storage error during " + e.op + ": " + e.cause.Error()
}
func (e *storageError) Unwrap() []error { return []error{ErrStorage, e.cause} }

func storageErr(op string, err error) error {
	if err == nil {
		return nil
	}
	var se *storageError
	if errors.As(err, &se) {
		return err
	}
	return &storageError{op: op, cause: err}
}

// failedError is ErrStorageFailed with the operation and I/O error that
// caused it.
type failedError struct {
	op    string
	cause error
}

func (e *failedError) Error() string {
	return "broker: storage failed during " + e.op + " (reopen required): " + e.cause.Error()
}
func (e *failedError) Unwrap() []error { return []error{ErrStorageFailed, e.cause} }

// lostError is ErrDataLost for one partition's range.
type lostError struct {
	topic       string
	partition   int32
	first, last int64
	reason      string
}

func (e *lostError) Error() string {
	return fmt.Sprintf("broker: data lost in %s/%d offsets %d to %d: %s", e.topic, e.partition, e.first, e.last, e.reason)
}
func (e *lostError) Unwrap() error { return ErrDataLost }

// LostOffsets returns the first and last offset of the lost range err
// (an ErrDataLost from a fetch) names; ok is false for any other error.
func LostOffsets(err error) (first, last int64, ok bool) {
	var le *lostError
	if !errors.As(err, &le) {
		return 0, 0, false
	}
	return le.first, le.last, true
}

// KafkaErrorCode maps an error returned by this package to the Kafka protocol
// error code a listener should put in its response (0 for nil).
func KafkaErrorCode(err error) int16 {
	switch {
	case err == nil:
		return 0
	case errors.Is(err, ErrInvalidCRC), errors.Is(err, ErrCorruptBatch):
		return kerr.CorruptMessage.Code
	case errors.Is(err, ErrUnsupportedMagic):
		return kerr.UnsupportedForMessageFormat.Code
	case errors.Is(err, ErrMessageTooLarge):
		return kerr.MessageTooLarge.Code
	case errors.Is(err, ErrInvalidTopic):
		return kerr.InvalidTopicException.Code
	case errors.Is(err, ErrTopicExists):
		return kerr.TopicAlreadyExists.Code
	case errors.Is(err, ErrInvalidConfig):
		return kerr.InvalidConfig.Code
	case errors.Is(err, ErrInvalidPartitions):
		return kerr.InvalidPartitions.Code
	case errors.Is(err, ErrRecentlyDeleted):
		return kerr.TopicAlreadyExists.Code
	case errors.Is(err, ErrUnknownTopicOrPartition):
		return kerr.UnknownTopicOrPartition.Code
	case errors.Is(err, ErrOffsetOutOfRange):
		return kerr.OffsetOutOfRange.Code
	case errors.Is(err, ErrDuplicateSequence):
		return kerr.DuplicateSequenceNumber.Code
	case errors.Is(err, ErrOutOfOrderSequence):
		return kerr.OutOfOrderSequenceNumber.Code
	case errors.Is(err, ErrInvalidProducerEpoch):
		return kerr.InvalidProducerEpoch.Code
	case errors.Is(err, ErrUnknownProducerID):
		return kerr.UnknownProducerID.Code
	case errors.Is(err, ErrProducerFenced):
		return kerr.ProducerFenced.Code
	case errors.Is(err, ErrInvalidProducerIDMapping):
		return kerr.InvalidProducerIDMapping.Code
	case errors.Is(err, ErrInvalidTxnState):
		return kerr.InvalidTxnState.Code
	case errors.Is(err, ErrConcurrentTransactions):
		return kerr.ConcurrentTransactions.Code
	case errors.Is(err, ErrInvalidTransactionTimeout):
		return kerr.InvalidTransactionTimeout.Code
	case errors.Is(err, ErrUnknownTransactionalID):
		return kerr.TransactionalIDNotFound.Code
	case errors.Is(err, ErrReservedProducerID):
		return kerr.InvalidProducerIDMapping.Code
	case errors.Is(err, ErrKeylessCompacted):
		return kerr.InvalidRecord.Code
	case errors.Is(err, ErrTransactionalUnsupported):
		return kerr.UnsupportedVersion.Code
	case errors.Is(err, ErrUnknownGroup):
		return kerr.GroupIDNotFound.Code
	case errors.Is(err, ErrStorage):
		return kerr.KafkaStorageError.Code
	case errors.Is(err, ErrClosed), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return kerr.RequestTimedOut.Code
	default:
		return kerr.UnknownServerError.Code
	}
}
