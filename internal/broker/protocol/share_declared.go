package protocol

import (
	"errors"
	"fmt"
)

// ShareGroupConfigNames are the configs a share group takes, by Kafka's
// names, as IncrementalAlterConfigs on the group resource sets them.
var ShareGroupConfigNames = []string{
	cfgShareAutoOffsetReset,
	cfgShareLockDuration,
	cfgShareDeliveryLimit,
	cfgSharePartitionLocks,
	cfgShareDLQTopic,
}

// ErrUnknownShareGroupConfig is returned by ValidateShareGroupConfig for
// a name that is not one of ShareGroupConfigNames.
var ErrUnknownShareGroupConfig = errors.New("unknown share group config")

// ValidateShareGroupConfig checks one share group config as
// IncrementalAlterConfigs SET does: the same rules, the same message.
func ValidateShareGroupConfig(name, value string) error {
	var c shareConfig
	return c.set(name, value, false)
}

// ShareGroupConfig is one config of a share group.
type ShareGroupConfig struct {
	Name, Value string
}

// ApplyShareGroupConfigs sets a share group's configs as one
// IncrementalAlterConfigs SET of them would: all or none, creating the
// group if there is none yet, and persisting them with its share state.
// Configs it does not name keep their value. A group id used by a classic
// or consumer group is refused.
func (s *Server) ApplyShareGroupConfigs(group string, configs []ShareGroupConfig) error {
	if group == "" {
		return errors.New("a share group id is not empty")
	}
	names, values, dels := make([]string, len(configs)), make([]string, len(configs)), make([]bool, len(configs))
	for i, c := range configs {
		names[i], values[i] = c.Name, c.Value
	}
	if _, err := s.share.alterConfigs(group, names, values, dels, true, false); err != nil {
		return fmt.Errorf("share group %s: %w", group, err)
	}
	return nil
}
