"""The metric families RabbitMQ's own Grafana dashboards and alerts read.

Read off the PromQL of RabbitMQ 3.10.8's dashboards
(rabbitmq-server `deps/rabbitmq_prometheus/docker/grafana/dashboards/*.json` at tag
v3.10.8) and of the alerting rules of RabbitMQ's Kubernetes cluster operator
(rabbitmq/cluster-operator `observability/prometheus/rules/**.yml`); label names
(`rabbitmq_cluster`, `rabbitmq_node`, ...) and recording-rule outputs are left out.
test_dashboards.py checks that Leveret serves each of them, or that NOT_SERVED says why.
"""

from __future__ import annotations

DASHBOARDS: dict[str, tuple[str, ...]] = {
    "Erlang-Distribution": (
        "erlang_vm_dist_node_queue_size_bytes",
        "erlang_vm_dist_node_state",
        "erlang_vm_dist_port_memory_bytes",
        "erlang_vm_dist_port_queue_size_bytes",
        "erlang_vm_dist_proc_memory_bytes",
        "erlang_vm_dist_proc_message_queue_len",
        "erlang_vm_dist_proc_reductions",
        "erlang_vm_dist_proc_status",
        "erlang_vm_dist_recv_bytes",
        "erlang_vm_dist_recv_cnt",
        "erlang_vm_dist_send_bytes",
        "erlang_vm_dist_send_cnt",
        "rabbitmq_identity_info",
    ),
    "Erlang-Distributions-Compare": (
        "erlang_vm_dist_send_bytes",
        "rabbitmq_identity_info",
    ),
    "Erlang-Memory-Allocators": (
        "erlang_vm_allocators",
        "rabbitmq_identity_info",
        "rabbitmq_process_resident_memory_bytes",
    ),
    "RabbitMQ-Overview": (
        "rabbitmq_build_info",
        "rabbitmq_channels",
        "rabbitmq_channels_closed_total",
        "rabbitmq_channels_opened_total",
        "rabbitmq_connections",
        "rabbitmq_connections_closed_total",
        "rabbitmq_connections_opened_total",
        "rabbitmq_consumers",
        "rabbitmq_disk_space_available_bytes",
        "rabbitmq_global_messages_acknowledged_total",
        "rabbitmq_global_messages_confirmed_total",
        "rabbitmq_global_messages_delivered_consume_auto_ack_total",
        "rabbitmq_global_messages_delivered_consume_manual_ack_total",
        "rabbitmq_global_messages_delivered_get_auto_ack_total",
        "rabbitmq_global_messages_delivered_get_manual_ack_total",
        "rabbitmq_global_messages_get_empty_total",
        "rabbitmq_global_messages_received_confirm_total",
        "rabbitmq_global_messages_received_total",
        "rabbitmq_global_messages_redelivered_total",
        "rabbitmq_global_messages_routed_total",
        "rabbitmq_global_messages_unroutable_dropped_total",
        "rabbitmq_global_messages_unroutable_returned_total",
        "rabbitmq_identity_info",
        "rabbitmq_process_max_fds",
        "rabbitmq_process_max_tcp_sockets",
        "rabbitmq_queue_messages_ready",
        "rabbitmq_queue_messages_unacked",
        "rabbitmq_queues",
        "rabbitmq_queues_created_total",
        "rabbitmq_queues_declared_total",
        "rabbitmq_queues_deleted_total",
        "rabbitmq_resident_memory_limit_bytes",
    ),
    "RabbitMQ-Quorum-Queues-Raft": (
        "rabbitmq_identity_info",
        "rabbitmq_raft_entry_commit_latency_seconds",
        "rabbitmq_raft_log_commit_index",
        "rabbitmq_raft_log_last_written_index",
        "rabbitmq_raft_term_total",
    ),
    "RabbitMQ-Stream": (
        "rabbitmq_global_consumers",
        "rabbitmq_global_messages_confirmed_total",
        "rabbitmq_global_messages_delivered_total",
        "rabbitmq_global_messages_received_total",
        "rabbitmq_global_publishers",
        "rabbitmq_global_stream_error_access_refused_total",
        "rabbitmq_global_stream_error_authentication_failure_total",
        "rabbitmq_global_stream_error_frame_too_large_total",
        "rabbitmq_global_stream_error_internal_error_total",
        "rabbitmq_global_stream_error_precondition_failed_total",
        "rabbitmq_global_stream_error_publisher_does_not_exist_total",
        "rabbitmq_global_stream_error_sasl_authentication_failure_loopback_total",
        "rabbitmq_global_stream_error_sasl_challenge_total",
        "rabbitmq_global_stream_error_sasl_error_total",
        "rabbitmq_global_stream_error_sasl_mechanism_not_supported_total",
        "rabbitmq_global_stream_error_stream_already_exists_total",
        "rabbitmq_global_stream_error_stream_does_not_exist_total",
        "rabbitmq_global_stream_error_stream_not_available_total",
        "rabbitmq_global_stream_error_subscription_id_already_exists_total",
        "rabbitmq_global_stream_error_subscription_id_does_not_exist_total",
        "rabbitmq_global_stream_error_unknown_frame_total",
        "rabbitmq_global_stream_error_vhost_access_failure_total",
    ),
    "alert:cluster-alarms": (
        "rabbitmq_alarms_file_descriptor_limit",
        "rabbitmq_alarms_free_disk_space_watermark",
        "rabbitmq_alarms_memory_used_watermark",
        "rabbitmq_identity_info",
    ),
    "alert:container-restarts": ("rabbitmq_identity_info",),
    "alert:file-descriptors-near-limit": (
        "rabbitmq_identity_info",
        "rabbitmq_process_max_fds",
        "rabbitmq_process_open_fds",
    ),
    "alert:high-connection-churn": (
        "rabbitmq_connections",
        "rabbitmq_connections_closed_total",
        "rabbitmq_connections_opened_total",
        "rabbitmq_identity_info",
    ),
    "alert:insufficient-established-erlang-distribution-links": (
        "erlang_vm_dist_node_state",
        "rabbitmq_build_info",
        "rabbitmq_identity_info",
    ),
    "alert:low-disk-watermark-predicted": (
        "rabbitmq_disk_space_available_bytes",
        "rabbitmq_disk_space_available_limit_bytes",
        "rabbitmq_identity_info",
    ),
    "alert:queue-has-no-consumers": (
        "rabbitmq_detailed_queue_consumers",
        "rabbitmq_detailed_queue_messages",
        "rabbitmq_identity_info",
    ),
    "alert:queue-is-growing": (
        "rabbitmq_detailed_queue_messages",
        "rabbitmq_identity_info",
    ),
    "alert:unroutable-messages": (
        "rabbitmq_channel_messages_unroutable_dropped_total",
        "rabbitmq_channel_messages_unroutable_returned_total",
        "rabbitmq_identity_info",
    ),
    "inet_tcp_metrics": (
        "rabbitmq_build_info",
        "rabbitmq_identity_info",
    ),
}
