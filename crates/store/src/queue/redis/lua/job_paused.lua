-- paused_groups: {group, '<since ms>|<reason>', ...}.
return redis.call('HGETALL', PAUSED)
