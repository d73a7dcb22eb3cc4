"""Deliberate breakages, each of which a named test must catch.

    python .ci/mutations.py [--only=NAME,...] [--keep]

For each mutation: a fresh copy of the committed tree (`git worktree`, so uncommitted
edits are not in it), one replacement inside one function, then the tests that name it;
the mutation is caught when they fail. A mutation is anchored to a scope, not to a line
of a file: a function, method or class by its qualified name (`Reporter.end`) or a
module-level assignment by its name (`METRICS`), or in a Markdown file a heading line;
its text must occur exactly once inside that scope. So moving or editing code elsewhere
in the file, or moving other functions to other modules, breaks no mutation that aims
elsewhere. Prints a line per mutation (ERROR: the tests could not run, e.g. a Python
without the test extra) and exits 1 unless all were caught.
Run it with the Python of a virtualenv that has `pip install -e '.[test]'`. Not part of
`.ci/run` (it takes about 5 minutes on a 2-core machine).
"""

import argparse
import ast
import os
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# name: (file, scope, text, its replacement, the tests that must fail)
MUTATIONS = {
    "appended records rewrite the whole file": (
        "transformer_jax/files.py",
        "append_line",
        "  if is_remote(path):\n    old = path.read_bytes()",
        "  if True:\n    old = path.read_bytes()",
        "tests/test_files.py::test_processes_appending_at_once_lose_no_line"),
    "a stop held over an import is dropped": (
        "transformer_jax/stop_policy.py",
        "stops_held",
        "      signal.raise_signal(signum)",
        "      pass",
        "tests/test_files.py::test_a_stop_during_a_held_import_acts_once_when_it_ends"),
    "a search gives a failed trial up without its retry": (
        "launch/search.py",
        "Reporter.end",
        "  if tries <= search.retries:",
        "  if tries < search.retries:",
        "tests/launch/test_search.py::test_a_failed_trial_is_retried_in_its_own_workdir_then_given_up"),
    "a search samples one trial past its budget": (
        "launch/search.py",
        "next_trial",
        "    if (len(counted(trials)) >= search.trials and not waiting) or hours_spent(trials, search):",
        "    if (len(counted(trials)) > search.trials and not waiting) or hours_spent(trials, search):",
        "tests/launch/test_search.py::test_a_search_prunes_spends_its_budget_once_and_reports_best_first"),
    "a search forgets the trial its dead launcher left running": (
        "launch/search.py",
        "_resume",
        "    if frozen.state != states.RUNNING or not (why := seen.why_free(frozen)):",
        "    if True:",
        "tests/launch/test_search.py::test_a_launcher_killed_mid_study_resumes_its_trial_with_the_same_values"),
    "a search's pruners ignore first_rung": (
        "launch/search_space.py",
        "Search.make_pruner",
        '    rungs = {"min_resource": self.first_rung, "reduction_factor": self.reduction_factor}',
        '    rungs = {"reduction_factor": self.reduction_factor}',
        "tests/launch/test_search.py::test_the_pruners_count_evaluations_from_the_first_rung_and_never_judge_the_last"),
    "a search's pruners count steps where trials report evaluations": (
        "launch/search.py",
        "Reporter.evaluation",
        "    return -(-step // self.every)",
        "    return step",
        "tests/launch/test_search.py::test_the_pruners_count_evaluations_from_the_first_rung_and_never_judge_the_last"),
    "a search's BLEU rungs count loss passes": (
        "launch/search_space.py",
        "Search.every",
        "    return (train.bleu_every_steps if bleu else train.eval_every_steps) or \\",
        "    return train.eval_every_steps or \\",
        "tests/launch/test_search.py::test_rungs_fall_on_the_metrics_own_evaluations_and_brackets_follow_the_config"),
    "a search's Hyperband takes its brackets from the trials seen": (
        "launch/search_space.py",
        "Search.make_pruner",
        "            \"hyperband\": lambda: p.HyperbandPruner(**rungs, max_resource=full),",
        "            \"hyperband\": lambda: p.HyperbandPruner(**rungs),",
        "tests/launch/test_search.py::test_rungs_fall_on_the_metrics_own_evaluations_and_brackets_follow_the_config"),
    "a search prunes a trial at its last evaluation": (
        "launch/search.py",
        "Reporter.watch",
        "      if prune and step < self.last and self.trial.should_prune():",
        "      if prune and self.trial.should_prune():",
        "tests/launch/test_search.py::test_the_pruners_count_evaluations_from_the_first_rung_and_never_judge_the_last"),
    "a search retries a diverged trial": (
        "launch/search.py",
        "Reporter.end",
        "    if ended.get(\"code\") == cli.EXIT_NONFINITE:",
        "    if False:",
        "tests/launch/test_search.py::test_a_diverged_trial_fails_and_is_not_retried_and_a_crash_is"),
    "a study takes any SEARCH": (
        "launch/study.py",
        "_check_search",
        "  if refused:",
        "  if False:",
        "tests/launch/test_search.py::test_a_study_refuses_a_changed_search_in_one_line_and_changes_nothing"),
    "a search counts trials added from a grid against its budget": (
        "launch/search.py",
        "counted",
        '  return [t for t in trials if "retry_of" not in t.user_attrs and "warm_start" not in',
        '  return [t for t in trials if "retry_of" not in t.user_attrs and "warm_stop" not in',
        "tests/launch/test_search.py::test_a_search_starts_from_its_config_and_a_finished_grids_trials_once"),
    "a search resumes a trial its dead launcher had pruned": (
        "launch/search.py",
        "_resume",
        "      study.tell(frozen.number, state=states.PRUNED)  # telling the study.",
        "      pass",
        "tests/launch/test_search.py::test_a_launcher_killed_between_the_pruned_marker_and_telling_leaves_no_trial_running"),
    "a SLURM search's script carries the storage's password": (
        "launch/targets/slurm.py",
        "search_script",
        '             f"--storage={study_lib.without_password(storage)}", "--target=local",',
        '             f"--storage={storage}", "--target=local",',
        "tests/launch/test_search.py::test_a_storage_password_is_in_no_file_output_or_command_line"),
    "a search's device-hours budget never stops it": (
        "launch/search.py",
        "hours_spent",
        "  return search.device_hours is not None and device_hours(trials) >= search.device_hours",
        "  return False",
        "tests/launch/test_search_sizes.py::test_the_device_hours_budget_stops_new_trials_and_lets_started_ones_end"),
    "a search's trial of several nodes gets one": (
        "launch/search_space.py",
        "Search.placement",
        "      return size // node_devices, 1",
        "      return 1, 1",
        "tests/launch/test_search_sizes.py::test_a_trial_takes_whole_nodes_or_a_share_of_one_and_nothing_between"),
    "trials sharing a SLURM node share its first GPUs": (
        "launch/targets/slurm.py",
        "search_script",
        "f{i * size + 1}-{i * size + size}",
        "f1-{size}",
        "tests/launch/test_search_sizes.py::test_a_slurm_searchs_tasks_span_the_trials_nodes_or_share_a_node_among"
        "_launchers"),
    "a search's pruned trial on a TPU is never stopped": (
        "launch/targets/tpu.py",
        "_SearchTrial.look",
        '      tpu_vm.call(tpu_vm.stop_run(tpu, "TERM"))',
        "      pass",
        "tests/launch/test_tpu_launch.py::test_a_search_on_tpus_prunes_on_the_tpu_and_leaves_no_tpu"),
    "the residual norm reads its block at the whole array's row offset": (
        "transformer_jax/kernels/residual_norm.py",
        "_tile",
        "  value = ref[...].astype(jnp.float32)",
        "  value = ref[pl.ds(row_start, rows), :].astype(jnp.float32)",
        "tests/kernels/test_residual_norm.py"),
    "the fused loss lets the padded vocabulary into its log-sum-exp": (
        "transformer_jax/kernels/vocabulary_loss.py",
        "_forward_kernel.walk",
        "    z = jnp.where(cols < vocab_size, z, -jnp.inf)",
        "    z = z",
        "tests/kernels/test_vocabulary_loss.py"),
    "the fused loss drops the smoothing term's mean logit": (
        "transformer_jax/model/losses.py",
        "fused_token_metrics",
        "label_smoothing * (lse - mean)",
        "label_smoothing * lse",
        "tests/kernels/test_vocabulary_loss.py"),
    "the fused loss's h gradient reads the wrong vocabulary tile": (
        "transformer_jax/kernels/vocabulary_loss.py",
        "_grad_h_kernel.walk",
        "g, w_ref[pl.ds(start, tiles.vocab), pl.ds(k, step)],",
        "g, w_ref[pl.ds(0, tiles.vocab), pl.ds(k, step)],",
        "tests/kernels/test_vocabulary_loss.py"),
    "the fused loss's embedding gradient walks the wrong tokens": (
        "transformer_jax/kernels/vocabulary_loss.py",
        "_grad_w_kernel.walk",
        "        g, h_ref[span, pl.ds(k, step)], (((0,), (0,)), ((), ())),",
        "        g, h_ref[pl.ds(0, rows), pl.ds(k, step)], (((0,), (0,)), ((), ())),",
        "tests/kernels/test_vocabulary_loss.py"),
    "the TPU's fused loss lets the padded vocabulary into its log-sum-exp": (
        "transformer_jax/kernels/vocabulary_loss_tpu.py",
        "_forward_kernel",
        "  z = jnp.where(cols < vocab_size, z, -jnp.inf)",
        "  z = z",
        "tests/kernels/test_vocabulary_loss.py"),
    "the TPU's fused forward and h gradient read one vocabulary tile throughout": (
        "transformer_jax/kernels/vocabulary_loss_tpu.py",
        "_blocks",
        "  col = (lambda i, j: (j, 0)) if rows_axis == 0 else (lambda j, i: (j, 0))",
        "  col = (lambda i, j: (0, 0)) if rows_axis == 0 else (lambda j, i: (j, 0))",
        "tests/kernels/test_vocabulary_loss.py"),
    "the TPU's fused loss's embedding gradient reads one row tile throughout": (
        "transformer_jax/kernels/vocabulary_loss_tpu.py",
        "_blocks",
        "  row = (lambda i, j: (i, 0)) if rows_axis == 0 else (lambda j, i: (i, 0))",
        "  row = (lambda i, j: (i, 0)) if rows_axis == 0 else (lambda j, i: (0, 0))",
        "tests/kernels/test_vocabulary_loss.py"),
    "the fused loss's sums are not added over the batch's shards": (
        "transformer_jax/training/step.py",
        "_on_each_batch_shard",
        "lambda *args: jax.lax.psum(scoped(*args), placement.row_axes()), (True, False, True),",
        "lambda *args: scoped(*args), (True, False, True),",
        "tests/test_partitioning.py::test_the_fused_loss_kernel_trains_as_xla_does_on_one_"
        "device_and_sharded"),
    "a Pallas kernel's FLOPs go uncounted": (
        "transformer_jax/planning/roofline.py",
        "_kernel",
        "    flops += _pallas_flops(instruction, shapes)",
        "    flops += 0",
        "tests/planning/test_roofline.py::test_the_fused_loss_kernels_count_their_products_and_every_result"),
    "a Pallas kernel's results counted as a library call's result and workspace": (
        "transformer_jax/planning/roofline.py",
        "_written",
        "      PALLAS_TARGET not in instruction.attributes):",
        "      True):",
        "tests/planning/test_roofline.py::test_the_fused_loss_kernels_count_their_products_and_every_result"),
    "the fused residual norm keeps dropped-out scale": (
        "transformer_jax/kernels/residual_norm.py",
        "_normalized",
        "    s = s / (1.0 - rate)",
        "    s = s",
        "tests/kernels/test_residual_norm.py"),
    "the fused residual norm's gradient drops LayerNorm's mean term": (
        "transformer_jax/kernels/residual_norm.py",
        "_backward_kernel",
        "  dz = rstd[:, None] * (g - (jnp.sum(g, axis=1) / d)[:, None]",
        "  dz = rstd[:, None] * (g",
        "tests/kernels/test_residual_norm.py"),
    "the fused residual norm keeps the rate instead of one minus it": (
        "transformer_jax/kernels/residual_norm.py",
        "keep_mask",
        "(1.0 - rate) * 2.0**32",
        "rate * 2.0**32",
        "tests/kernels/test_residual_norm.py"),
    "the fused residual norm's statistics count padded columns": (
        "transformer_jax/kernels/residual_norm.py",
        "_normalized",
        "  centered = jnp.where(real, z - mean[:, None], 0.0)",
        "  centered = z - mean[:, None]",
        "tests/kernels/test_residual_norm.py"),
    "the fused residual norm's dropout bits follow each shard's own rows": (
        "transformer_jax/model/transformer.py",
        "FusedResidualNorm.__call__.norm",
        "epsilon=cfg.layer_norm_epsilon, first_row=first)",
        "epsilon=cfg.layer_norm_epsilon, first_row=0)",
        "tests/test_partitioning.py::test_the_fused_residual_norms_dropout_does_not_depend_on_"
        "the_devices"),
    "an error a stop caused reads as the library's own": (
        "transformer_jax/cli.py",
        "run.main_with_argv",
        "      if code and _SIGNALLED:  # An error a stop caused (fail() printed nothing).",
        "      if False:  # An error a stop caused (fail() printed nothing).",
        "tests/test_cli.py::test_a_stop_a_library_turns_into_its_own_error_still_ends_as_a_stop"),
    "a stop a library raised as its own error ends in a traceback": (
        "transformer_jax/cli.py",
        "run.main_with_argv",
        "    except Exception:\n      if not _SIGNALLED:\n        raise",
        "    except Exception:\n      if True:\n        raise",
        "tests/test_cli.py::test_a_stop_a_library_turns_into_its_own_error_still_ends_as_a_stop"),
    "another host's lease judged by its time stamp": (
        "transformer_jax/training/workdir_lock.py",
        "Lease._holder_state",
        '    beat = lambda lease: (lease.get("beats"), lease.get("heartbeat"))',
        '    beat = lambda lease: 0',
        "tests/training/test_workdir_lock.py::test_a_lease_from_another_host_is_taken_only_"
        "once_its_heartbeat_stops"),
    "the token cache trusted unchecked": (
        "transformer_jax/data/tokenized.py",
        "load_or_build",
        "      damage = _damage(directory, tokenizer.vocab_size)",
        "      damage = None",
        "tests/data/test_tasks.py::test_a_changed_or_damaged_token_cache_is_named_and_rebuilt_"
        "never_trained_on"),
    "steps lowered below the newest checkpoint resume silently": (
        "transformer_jax/training/loop.py",
        "train_and_evaluate",
        "    run_files.check_steps(cfg, workdir)\n",
        "",
        "tests/training/test_run_files.py::test_steps_lowered_below_the_newest_checkpoint_stop_"
        "in_one_line_writing_nothing"),
    "translate writes its output in place": (
        "transformer_jax/translate.py",
        "_output",
        '  tmp = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.tmp")',
        "  tmp = target",
        "tests/scenarios/test_outputs.py::test_a_translation_stopped_midway_leaves_the_old_"
        "output_untouched"),
    "the MarianMT export swaps the query and key projections": (
        "transformer_jax/inference/marian.py",
        "_attention",
        '("query", "q_proj"), ("key", "k_proj"),',
        '("query", "k_proj"), ("key", "q_proj"),',
        "tests/inference/test_huggingface.py::test_the_export_loads_in_transformers_and_"
        "computes_what_the_run_does"),
    "the MarianMT export loses the embedding scale": (
        "transformer_jax/inference/huggingface.py",
        "marian_config",
        '"scale_embedding": True,',
        '"scale_embedding": False,',
        "tests/inference/test_huggingface.py::test_the_export_loads_in_transformers_and_"
        "computes_what_the_run_does"),
    "the MarianMT export keeps the interleaved sinusoids' order": (
        "transformer_jax/inference/marian.py",
        "hidden_order",
        "  return np.concatenate([np.arange(0, d_model, 2), np.arange(1, d_model, 2)])",
        "  return np.arange(d_model)",
        "tests/inference/test_huggingface.py::test_the_export_loads_in_transformers_and_"
        "computes_what_the_run_does"),
    "an imported model loses its logits bias": (
        "transformer_jax/inference/huggingface.py",
        "model_fields",
        'logits_bias=bool(np.any(tensors.get("final_logits_bias", 0))),',
        "logits_bias=False,",
        "tests/inference/test_huggingface.py::test_an_opus_mt_folder_imports_translates_as_"
        "transformers_and_exports_back"),
    "Marian's ids kept in Marian's order": (
        "transformer_jax/data/tokenizer.py",
        "marian_order",
        "  first = [where[pad], where[eos], where[unk]]",
        "  first = []",
        "tests/data/test_tokenizer.py::test_a_marian_tokenizer_reorders_ids_and_segments_each_"
        "side_with_its_model"),
    "finish_within_beam finishes any ranked EOS": (
        "transformer_jax/model/beam_search.py",
        "beam_search.step",
        "      finish = finish & (jnp.arange(2 * k) < k)[None, :]  # cand_logp is sorted.",
        "      finish = finish",
        "tests/model/test_decode.py::test_finish_within_beam_finishes_only_a_steps_best_beam_"
        "candidates"),
    "a library call's workspace counted as data": (
        "transformer_jax/planning/roofline.py",
        "_written",
        "    shape = _ARRAY.search(shape).group(0)  # a library's is (result, workspace).",
        "    shape = shape  # a library's is (result, workspace).",
        "tests/planning/test_roofline.py::test_a_library_calls_result_is_counted_not_its"
        "_workspace"),
    "a loop's kernels counted once": (
        "transformer_jax/planning/roofline.py",
        "kernels.walk",
        "          walk(name, runs * (int(trips.group(1)) if trips else 1))",
        "          walk(name, runs)",
        "tests/planning/test_roofline.py::test_a_loops_kernels_count_once_a_trip"),
    "overlapping kernels counted as busy twice": (
        "transformer_jax/benchmarks/step_profile.py",
        "breakdown",
        "    busy += max(0.0, stop - max(start, end))",
        "    busy += stop - start",
        "tests/benchmarks/test_step_profile.py::test_the_categories_and_idle_add_up_to_the"
        "_traced_steps"),
    "embedding gradient summed in bfloat16": (
        "transformer_jax/model/transformer.py",
        "Transformer.setup",
        "    embed = lambda name: Embed(",
        "    embed = lambda name: nn.Embed(",
        "tests/model/test_model.py::test_the_embedding_gradient_sums_in_float32_under_bfloat16"),
    "ensemble averages probabilities": (
        "transformer_jax/model/beam_search.py",
        "ensemble_decoder.step",
        "return sum(log_probs) / len(decoders),",
        "return jnp.log(sum(jnp.exp(lp) for lp in log_probs) / len(decoders)),",
        "tests/inference/test_export.py::test_an_ensemble_averages_its_models_log_probabilities"),
    "ensemble uses its first model only": (
        "transformer_jax/model/beam_search.py",
        "ensemble_decoder.step",
        "return sum(log_probs) / len(decoders),",
        "return log_probs[0],",
        "tests/inference/test_export.py::test_an_ensemble_averages_its_models_log_probabilities"),
    "keep_best_by=eval/bleu kept lowest": (
        "transformer_jax/config/fields.py",
        "METRICS",
        '"bleu": Metric("bleu", False),',
        '"bleu": Metric("bleu", True),',
        "tests/training/test_early_stopping.py::test_keep_best_by_bleu_keeps_the_highest"),
    "CTranslate2 gets alpha raw": (
        "transformer_jax/inference/ctranslate2.py",
        "ctranslate2_translate_ids",
        "length_penalty=alpha, patience",
        "length_penalty=decode_cfg.length_penalty, patience",
        "tests/inference/test_export.py::test_the_export_decodes_as_the_checkpoint_at_beam_4_and_alpha_0_6"),
    "CTranslate2 without the length margin": (
        "transformer_jax/inference/ctranslate2.py",
        "ctranslate2_translate_ids",
        "max_decoding_length=length + decode_cfg.max_extra_length - 1)",
        "max_decoding_length=length)",
        "tests/inference/test_export.py::test_the_export_decodes_as_the_checkpoint_at_beam_4_and_alpha_0_6"),
    "CTranslate2's length limit one for a whole batch": (
        "transformer_jax/inference/ctranslate2.py",
        "ctranslate2_translate_ids",
        "max_decoding_length=length + decode_cfg",
        "max_decoding_length=max(map(len, encoded)) + decode_cfg",
        "tests/inference/test_export.py::test_the_export_decodes_as_the_checkpoint_at_beam_4_and_alpha_0_6"),
    "the loss's gradient drops the smoothing": (
        "transformer_jax/model/losses.py",
        "_smoothed_cross_entropy_backward",
        "          - g_loss * eps / vocab)",
        "          )",
        "tests/model/test_losses.py::test_one_pass_loss_and_gradient_are_as_accurate_as_the"
        "_textbook_form"),
    "the chunked loss drops the smoothing": (
        "transformer_jax/model/losses.py",
        "chunked_token_metrics.add_chunk",
        "    sums = token_metrics(project(chunk[0]), chunk[1], label_smoothing)",
        "    sums = token_metrics(project(chunk[0]), chunk[1], 0.0)",
        "tests/training/test_training.py::test_hardware_rng_dropout_resumes_exactly_and_chunked"
        "_loss_trains_alike"),
    "microbatch gradients averaged over one microbatch's tokens": (
        "transformer_jax/training/step.py",
        "train_step",
        'grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"], 1.0), grads)',
        'grads = jax.tree.map(lambda g: g / jnp.maximum(sums["tokens"] / grad_accum_steps, '
        '1.0), grads)',
        "tests/test_partitioning.py::test_gradient_accumulation_equals_one_big_batch "
        "tests/scenarios/test_elastic_resume.py"),
    "every process reads process 0's rows": (
        "transformer_jax/partitioning.py",
        "shard_batch",
        "  local = local_rows(batch, jax.process_index(), jax.process_count())",
        "  local = local_rows(batch, 0, jax.process_count())",
        "tests/scenarios/test_multiprocess.py::test_two_processes_train_checkpoint_and_resume"
        "_like_one"),
    "a resume starts Adam's moments again": (
        "transformer_jax/training/run.py",
        "make_run",
        "      state = checkpoint.restore_state(ckpt, state)",
        "      state = checkpoint.restore_state(ckpt, state)\n"
        "      state = state.replace(opt_state=tx.init(state.params))",
        "tests/launch/test_launch.py::test_a_requeued_slurm_task_resumes_with_the_same_code_on"
        "_fewer_nodes tests/launch/test_tpu_launch.py::test_preempted_spot_tpus_are_recreated"
        "_until_every_trial_is_done"),
    "an attention block's projections counted as attention": (
        "transformer_jax/planning/roofline.py",
        "category",
        '  if "fmha" in opcode or ("attention/" in op_names and re.search(',
        '  if "fmha" in opcode or ("attention/" in op_names or re.search(',
        "tests/planning/test_roofline.py::test_a_kernels_category_comes_from_its_own"
        "_operations_not_the_enclosing_block"),
    "one launch floor for a loop's every trip": (
        "transformer_jax/planning/roofline.py",
        "predict",
        "ms=1e3 * max(compute, memory, k.runs * MIN_KERNEL_S),",
        "ms=1e3 * max(compute, memory, MIN_KERNEL_S),",
        "tests/planning/test_roofline.py::test_a_loops_kernels_count_once_a_trip"),
    "a stacked buffer updated in place counted whole": (
        "transformer_jax/planning/roofline.py",
        "_written",
        '  if root is not None and root.opcode == "dynamic-update-slice":',
        "  if False:",
        "tests/planning/test_roofline.py::test_a_layers_slice_of_stacked_weights_counts_the"
        "_slice_not_the_stack tests/planning/test_roofline.py::test_a_scanned_layers_trip_on"
        "_a_gpu_moves_its_layers_bytes"),
    "a layer's slice counted as the whole stack": (
        "transformer_jax/planning/roofline.py",
        "_read",
        '      if all(i.opcode in ("dynamic-slice", "slice") for i in users):',
        "      if False:",
        "tests/planning/test_roofline.py::test_a_layers_slice_of_stacked_weights_counts_the"
        "_slice_not_the_stack tests/planning/test_roofline.py::test_a_scanned_layers_trip_on"
        "_a_gpu_moves_its_layers_bytes"),
    "an asynchronous done counted as a kernel": (
        "transformer_jax/planning/roofline.py",
        "kernels.walk",
        'elif instruction.opcode not in _FREE and not instruction.opcode.endswith("-done"):',
        "elif instruction.opcode not in _FREE:",
        "tests/planning/test_roofline.py::test_a_scanned_layers_trip_on_a_gpu_moves_its_"
        "layers_bytes"),
    "the ReLU's gradient from its input": (
        "transformer_jax/model/transformer.py",
        "_relu_forward",
        "  return y, jax.lax.optimization_barrier(y)",
        "  return y, y",
        "tests/model/test_model.py::test_the_relus_gradient_reads_its_output_not_its_input"),
    "the GPU's ReLU on every platform": (
        "transformer_jax/model/transformer.py",
        "relu",
        "  return jax.lax.platform_dependent(x, cuda=relu_from_output, default=jax.nn.relu)",
        "  return relu_from_output(x)",
        "tests/model/test_model.py::test_the_relu_reads_its_output_only_where_lowered_for_a"
        "_gpu"),
    "the peers' ratio turned over": (
        "transformer_jax/benchmarks/peers.py",
        "with_ratios",
        '      row["ours_over_it"] = ours / row["tokens_per_s"]',
        '      row["ours_over_it"] = row["tokens_per_s"] / ours',
        "tests/benchmarks/test_peers.py::test_the_ratio_is_ours_over_the_peers_so_above_one"
        "_means_faster"),
    "one dropout key for every microbatch": (
        "transformer_jax/training/step.py",
        "train_step",
        "new = grads_and_sums(microbatch, jax.random.fold_in(rng, i))",
        "new = grads_and_sums(microbatch, rng)",
        "tests/training/test_training.py::test_dropout_masks_differ_across_microbatches_and_steps"
        "_and_repeat_on_resume"),
    "dropout key not folded with the step": (
        "transformer_jax/training/step.py",
        "train_step",
        "rng = jax.random.fold_in(dropout_key, state.step)",
        "rng = dropout_key",
        "tests/training/test_training.py::test_dropout_masks_differ_across_microbatches_and_steps"
        "_and_repeat_on_resume"),
    "sampler reuses one key": (
        "transformer_jax/model/beam_search.py",
        "sampler.pick",
        "jax.random.fold_in(jax.random.key(seed), i), z, axis=-1)",
        "jax.random.key(seed), z, axis=-1)",
        "tests/model/test_decode.py::test_sampled_tokens_differ_across_steps_and_repeat_with"
        "_the_seed"),
    "the loop runs 1000 steps ahead": (
        "transformer_jax/training/run_ahead.py",
        "InFlight.__init__",
        "def __init__(self, depth: int = 2):",
        "def __init__(self, depth: int = 1000):",
        "tests/training/test_run_ahead.py::test_the_host_runs_at_most_two_steps_ahead_of_the_devices"),
    "label smoothing over V - 1": (
        "transformer_jax/model/losses.py",
        "_smoothed_cross_entropy_forward",
        "lse - total / logits.shape[-1])",
        "lse - (total - target) / (logits.shape[-1] - 1))",
        "tests/model/test_losses.py::test_label_smoothed_loss_matches_a_hand_computation"),
    "cuDNN query lengths + 1": (
        "transformer_jax/model/attention.py",
        "AttentionMask.seq_lengths",
        "return (jnp.sum(self.query_valid, axis=-1, dtype=jnp.int32),",
        "return (jnp.sum(self.query_valid, axis=-1, dtype=jnp.int32) + 1,",
        "tests/benchmarks/test_gpu_lowering.py::test_sequence_length_masks_compute_what_dense_masks"
        "_compute"),
    "compile-only programs read from the persistent cache": (
        "transformer_jax/planning/topology.py",
        "_without_persistent_cache",
        'jax.config.update("jax_enable_compilation_cache", False)',
        "pass",
        "tests/planning/test_topology.py::test_the_smoke_config_compiles_for_a_slice_and_fits"
        " tests/planning/test_topology.py::test_a_cpu_machine_with_libtpu_installed_starts_without_its"
        "_tpu_probe_errors"),
    "beam search keeps each row's own cache": (
        "transformer_jax/model/attention.py",
        "select_cache_rows",
        "lambda x: jnp.take(x, rows, axis=x.ndim - 4), cache)",
        "lambda x: x, cache)",
        "tests/model/test_decode.py::test_a_reselected_row_goes_on_from_its_parents_history"
        " tests/model/test_decode.py::test_every_beam_scores_its_output_as_the_full_pass_does"),
    "the best checkpoint not kept": (
        "transformer_jax/checkpoint.py",
        "manager",
        "[ocp.checkpoint_managers.LatestN(keep), best]",
        "[ocp.checkpoint_managers.LatestN(keep)]",
        "tests/training/test_early_stopping.py::test_keep_best_by_bleu_keeps_the_highest"),
    "an epoch counted as one step": (
        "transformer_jax/config/__init__.py",
        "with_epochs",
        'getattr(train, f"{name}_every_epochs") * steps_per_epoch',
        'getattr(train, f"{name}_every_epochs")',
        "tests/training/test_training.py::test_epoch_cadences_are_the_steps_of_one_pass_over_the"
        "_training_pairs"),
    "targets pretokenized in the source language": (
        "transformer_jax/data/pretokenize.py",
        "Pretokenizer.target",
        "return self._prepare(texts, self.target_lang)",
        "return self._prepare(texts, self.source_lang)",
        "tests/inference/test_bleu.py::test_moses_lowercase_prepares_each_side_in_its_language_and"
        "_translations_are_text"),
    "fairseq's length penalty is GNMT's": (
        "transformer_jax/model/beam_search.py",
        "length_penalty",
        'return (length if form == "fairseq" else (5.0 + length) / 6.0) ** alpha',
        "return ((5.0 + length) / 6.0) ** alpha",
        "tests/model/test_decode.py::test_the_length_penalties_have_their_values"),
    "lowercase BLEU without lowercasing": (
        "transformer_jax/data/pretokenize.py",
        "moses_lowercase",
        "tools.tokenizer.tokenize(tools.normalizer.normalize(text.lower()),",
        "tools.tokenizer.tokenize(tools.normalizer.normalize(text),",
        "tests/inference/test_bleu.py::test_lowercase_bleu_is_fairseqs_bleu4_on_multi30k_papers_tokens"),
    "qkv kernels at the full Glorot variance": (
        "transformer_jax/model/attention.py",
        "MultiHeadAttention.__call__",
        'w_init = nn.initializers.variance_scaling(cfg.qkv_init_scale, "fan_avg", "uniform",',
        'w_init = nn.initializers.variance_scaling(1.0, "fan_avg", "uniform",',
        "tests/model/test_model.py::test_qkv_init_scale_scales_the_query_key_and_value_variances"
        "_only"),
    "a SIGTERM to the local launcher stays there": (
        "launch/targets/local.py",
        "_sigterm_passed_on",
        "previous = signal.signal(signal.SIGTERM, pass_on)",
        "previous = signal.getsignal(signal.SIGTERM)",
        "tests/launch/test_launch.py::test_sigterm_to_the_local_launcher_alone_reaches_its_trial"),
    "a spent budget skips measuring too": (
        "transformer_jax/benchmarks/phases.py",
        "Phases.run",
        "          and not measures):",
        "          ):",
        "tests/benchmarks/test_benchmark.py::test_a_spent_budget_starts_no_compile_but_still_measures"
        "_what_compiled"),
    "bleu_lc cased": (
        "transformer_jax/inference/bleu.py",
        "score_translations",
        "sacrebleu.metrics.BLEU(lowercase=True)",
        "sacrebleu.metrics.BLEU(lowercase=False)",
        "tests/inference/test_bleu.py::test_bleu_lc_is_sacrebleus_lowercased_score_of_the_text"),
    "the workdir lease taken without an exclusive create": (
        "transformer_jax/training/workdir_lock.py",
        "Lease._create",
        "os.link(tmp, self.path)",
        "os.replace(tmp, self.path)",
        "tests/training/test_workdir_lock.py::test_of_starts_racing_for_one_workdir_exactly_one_holds"
        "_it"),
    "a killed holder's lease blocks the relaunch": (
        "transformer_jax/training/workdir_lock.py",
        "Lease._holder_state",
        'return "alive" if _running(',
        'return "alive" if True or _running(',
        "tests/training/test_workdir_lock.py::test_a_lease_left_by_a_killed_process_on_this_host_is"
        "_taken_at_once"),
    "the search may emit the padding id": (
        "transformer_jax/model/beam_search.py",
        "_allowed",
        "jnp.where((ids == PAD_ID) | ",
        "jnp.where((ids < 0) | ",
        "tests/model/test_decode.py::test_the_search_never_emits_the_padding_id_and_scores_as"
        "_teacher_forcing"),
    "a checkpoint of another model set aside as damaged": (
        "transformer_jax/checkpoint.py",
        "restore_state",
        "      raise mismatch_error(mngr, step, mismatches)  # Another model: not damage.",
        "      _set_aside(mngr, step, ValueError(mismatches[0]))\n      continue",
        "tests/training/test_run_files.py::test_restoring_a_checkpoint_of_another_model_moves"
        "_nothing"),
    "a read-only run's evaluation writes into it": (
        "transformer_jax/evaluate.py",
        "output_dir",
        "  if files.writable(workdir):",
        "  if True:",
        "tests/training/test_run_files.py::test_a_read_only_run_is_evaluated_translated_and_scored"),
    "accuracy judged better when lower": (
        "transformer_jax/config/fields.py",
        "METRICS",
        '"accuracy": Metric("eval", False)',
        '"accuracy": Metric("eval", True)',
        "tests/training/test_early_stopping.py::test_the_best_checkpoint_and_the_patience_"
        "follow_the_metrics_direction"),
    "looked-up embedding rows left in float32": (
        "transformer_jax/model/transformer.py",
        "Embed.__call__",
        "return jnp.take(self.embedding, inputs, axis=0).astype(jnp.dtype(self.dtype))",
        "return jnp.take(self.embedding, inputs, axis=0)",
        "tests/model/test_model.py::test_looked_up_embedding_rows_are_the_tables_rows_in_the_"
        "compute_dtype"),
    "a LayerNorm ignores model.layer_norm_epsilon": (
        "transformer_jax/model/transformer.py",
        "_layer_norm",
        "return nn.LayerNorm(epsilon=cfg.layer_norm_epsilon,",
        "return nn.LayerNorm(epsilon=1e-6,",
        "tests/model/test_model.py::test_layer_norm_epsilon_reaches_every_layer_norm"),
    "a control that saw no difference bounds the comparison": (
        "tests/conftest.py",
        "assert_within_rounding",
        '  assert any(controls.values()), f"the control saw no difference: {controls}"\n',
        "",
        "tests/test_comparisons.py::test_a_control_that_saw_no_difference_bounds_nothing"),
    "the rounding tolerance made far looser": (
        "tests/conftest.py",
        "ROUNDING_K",
        "ROUNDING_K = 10.0",
        "ROUNDING_K = 1000.0",
        "tests/test_comparisons.py::test_k_stays_tight"),
    "a difference below the reference ignored": (
        "tests/conftest.py",
        "relative_difference",
        "return float(np.abs(a - b).max() / scale if scale else np.abs(a).max())",
        "return float((a - b).max() / scale if scale else np.abs(a).max())",
        "tests/test_comparisons.py::test_relative_difference_counts_either_direction_scaled_"
        "by_the_reference"),
    "the export lets transformers generate the padding id": (
        "transformer_jax/inference/huggingface.py",
        "generation_config",
        '"bad_words_ids": [[pad]],',
        '"bad_words_ids": [],',
        "tests/inference/test_huggingface.py::test_the_exports_generation_config_converts_the_"
        "penalty_and_forbids_padding"),
    "an import refuses silu": (
        "transformer_jax/inference/huggingface.py",
        "FROM_ACTIVATION",
        '"swish": "swish", "silu": "swish",',
        '"swish": "swish",',
        "tests/inference/test_huggingface.py::test_every_name_transformers_has_for_an_activation"
        "_here_is_imported_as_it"),
    "an import ignores the decode margin": (
        "transformer_jax/import_model.py",
        "import_huggingface",
        "longest = config.model.max_len - config.decode.max_extra_length",
        "longest = config.model.max_len",
        "tests/inference/test_huggingface.py::test_an_import_shortens_data_max_length_to_what_"
        "its_positions_hold"),
    "translate copies its finished output into place": (
        "transformer_jax/translate.py",
        "_output",
        "    files.put_in_place(tmp, target)",
        "    target.write_bytes(tmp.read_bytes())",
        "tests/scenarios/test_outputs.py::test_translates_output_is_put_in_place_by_one_rename"),
    "a reader's folder of links left behind": (
        "transformer_jax/inference/restore.py",
        "_held",
        "    shutil.rmtree(view, ignore_errors=True)",
        "    pass",
        "tests/scenarios/test_outputs.py::test_a_readers_hidden_folder_of_links_is_removed_"
        "when_it_ends"),
    "a trial the other launcher finished counted as failed": (
        "launch/targets/local.py",
        "run_trial",
        '      return "elsewhere"  # Another launcher\'s, which held it and finished meanwhile.',
        '      return "failed"',
        "tests/launch/test_launch.py::test_a_trial_the_other_launcher_finished_meanwhile_"
        "counts_as_finished"),
    "one slice of an operand sliced several times counted": (
        "transformer_jax/planning/roofline.py",
        "_read",
        "        total += sum(_size(i.shape) for i in users)",
        "        total += _size(users[0].shape)",
        "tests/planning/test_roofline.py::test_an_operand_one_kernel_slices_several_times_"
        "counts_every_slice"),
    "the final evaluation averages the first checkpoints": (
        "transformer_jax/training/averaging.py",
        "snapshot_steps",
        "  return tuple(sorted([last, *earlier[:count - 1]]))",
        "  return tuple(sorted([last, *earlier[-(count - 1):]]))",
        "tests/training/test_final_average.py::test_the_snapshots_are_the_last_step_and_the_"
        "cadence_before_it"),
    "every step summed into the average": (
        "transformer_jax/training/averaging.py",
        "Window.add",
        "    if step not in self.steps or self.summed != list(self.steps[:self.steps.index(step)]):",
        "    if False:",
        "tests/training/test_final_average.py::test_the_average_is_the_mean_of_the_snapshots_"
        "within_rounding"),
    "a resumed run's average forgets the snapshots before the stop": (
        "transformer_jax/training/averaging.py",
        "Window.resume",
        "        window.summed, window.total = summed, restored.average_sum",
        "        pass",
        "tests/training/test_final_average.py::test_a_forced_checkpoint_in_the_window_is_no_"
        "snapshot_and_resuming_averages_the_same"),
    "interop.md's recipe leaves the sinusoids trainable": (
        "docs/interop.md",
        "### Fine-tuning an export in transformers",
        "        positions.weight.requires_grad_(False)  # Fixed sinusoids.",
        "        pass  # Fixed sinusoids.",
        "tests/inference/test_huggingface.py::test_an_export_fine_tuned_in_transformers_as_"
        "interop_md_says_trains_as_the_run"),
    "the cost trains on a padded batch where real tokens are asked": (
        "transformer_jax/planning/cost.py",
        "step_positions",
        "  return (train.batch_tokens / REAL_SHARE,",
        "  return (train.batch_tokens,",
        "tests/planning/test_cost.py::test_training_scales_with_steps_and_the_real_token_"
        "batch_costs_more"),
    "the cost counts a BLEU at an averaged run's last step": (
        "transformer_jax/training/cadence.py",
        "bleu_due",
        "  return step == last and average_last == 1 or (",
        "  return step == last or (",
        "tests/planning/test_cost.py::test_evaluations_and_saves_are_counted_as_the_loop_"
        "makes_them"),
    "the cost waits for every checkpoint write": (
        "transformer_jax/planning/cost.py",
        "checkpoint_part",
        "max(0.0, save_s - interval_s)",
        "save_s",
        "tests/planning/test_cost.py::test_checkpoints_cost_the_last_save_and_unless_deferred_"
        "what_outlasts_the_steps_between"),
    "the cost ignores deferred checkpoints": (
        "transformer_jax/planning/cost.py",
        "checkpoint_part",
        "  outlasting = 0.0 if cfg.train.defer_checkpoints else max(0.0, save_s - interval_s)",
        "  outlasting = max(0.0, save_s - interval_s)",
        "tests/planning/test_cost.py::test_checkpoints_cost_the_last_save_and_unless_deferred_"
        "what_outlasts_the_steps_between"),
    "token budgets count padded positions where real tokens are asked": (
        "transformer_jax/data/batching.py",
        "_bucket_plan",
        '  if count == "padded":',
        "  if True:",
        "tests/data/test_batching.py::test_real_token_batches_hold_the_budget_in_real_tokens_a_side"),
    "the paper-style BLEU without tensor2tensor's compound split": (
        "transformer_jax/inference/bleu.py",
        "paper_bleu.prepare",
        '    return re.sub(r"(\\S)-(\\S)", r"\\1 ##AT##-##AT## \\2", tokens)',
        "    return tokens",
        "tests/inference/test_bleu.py::test_paper_bleu_is_tensor2tensors_on_newstest2014"),
    "a tokenized split built here is never put in the bucket": (
        "transformer_jax/data/tasks.py",
        "load_task",
        "publish=jax.process_index() == 0, build=build)",
        "publish=False, build=build)",
        "tests/scenarios/test_remote.py::test_a_tokenized_split_in_a_bucket_is_made_once_and_copied_by_every_other_host"),
    "every trial of a search drawn from one seed": (
        "launch/search.py",
        "_draw",
        "  study.sampler = search.make_sampler(trial.number)",
        "  study.sampler = search.make_sampler(0)",
        "tests/launch/test_search.py::test_launchers_sharing_a_study_never_draw_one_value_twice"),
    "a run that averaged fewer checkpoints than asked says nothing": (
        "transformer_jax/training/evaluation.py",
        "final",
        "  if len(averaged) < cfg.train.average_last:",
        "  if False:",
        "tests/training/test_final_average.py::test_a_run_with_fewer_checkpoints_or_no_test_split_says_so_once_and_keeps_them"),
    "a search's fixed values never reach its trials": (
        "launch/search.py",
        "trial_run",
        "tuple(sorted({**experiment.search.fixed, **values}.items()))",
        "tuple(sorted(values.items()))",
        "tests/launch/test_search.py::test_a_searchs_fixed_values_reach_every_trial_beside_the_drawn_ones"),
    "a field both searched and fixed is let through": (
        "launch/search_space.py",
        "Search.problems",
        "for path in self.fixed if path in self.space]",
        "for path in self.fixed if False]",
        "tests/launch/test_search.py::test_a_bad_search_is_refused_in_one_line_before_any_study_exists"),
    "a study takes a search with other fixed values": (
        "launch/search_space.py",
        "Search.settings",
        '"fixed": dict(sorted(self.fixed.items()))}',
        "}",
        "tests/launch/test_search.py::test_a_study_refuses_a_changed_search_in_one_line_and_changes_nothing"),
    "the final line names the test split by a fixed label": (
        "transformer_jax/data/datasets/tfds.py",
        "TfdsDataset.split_name",
        '    subsets = getattr(self.builder(), "subsets", {}).get(split)',
        '    subsets = {"test": ["newstest2014"]}.get(split)',
        "tests/data/test_corpora.py::test_wmt14s_test_split_is_newstest2014_and_the_final_line"
        "_names_it"),
    "train.batch_tokens_count takes any value": (
        "transformer_jax/config/sections.py",
        "TrainConfig.__post_init__",
        "    _check(self.batch_tokens_count in TOKEN_COUNTS,",
        "    _check(True,",
        "tests/test_config.py::test_invalid_values_fail_naming_the_field"),
    "paper_bleu_2018 normalizes the references too": (
        "transformer_jax/inference/bleu.py",
        "paper_bleu_2018",
        "  return paper_bleu([replace_unicode_punctuation(h) for h in hypotheses], references, lang)",
        "  return paper_bleu(*[[replace_unicode_punctuation(t) for t in side]\n"
        "                     for side in (hypotheses, references)], lang)",
        "tests/inference/test_bleu.py::test_paper_bleu_2018_is_tensor2tensors_later_script_on"
        "_newstest2014"),
    "replace-unicode-punctuation's full stops take tabs too": (
        "transformer_jax/inference/bleu.py",
        "replace_unicode_punctuation",
        '  return re.sub("[。．] *", ". ", text).translate(_UNICODE_PUNCTUATION)',
        '  return re.sub(r"[。．]\\s*", ". ", text).translate(_UNICODE_PUNCTUATION)',
        "tests/inference/test_bleu.py::test_replace_unicode_punctuation_is_moses_script_rule_for"
        "_rule"),
    "gs:// credentials never looked for on a Google Cloud VM": (
        "transformer_jax/files.py",
        "missing_credentials",
        '  if os.environ.get("NO_GCE_CHECK", "").lower() != "true" and _on_google_cloud():',
        "  if False:",
        "tests/test_files.py::test_gs_paths_need_application_default_credentials_where_google"
        "_auth_finds_them"),
    "a bucket without credentials goes unnoticed": (
        "transformer_jax/cli.py",
        "parse_flags",
        "        reading and files.missing_credentials(value))):",
        "        False)):",
        "tests/launch/test_tpu_launch.py::test_a_bucket_without_credentials_is_refused_in_one"
        "_line_touching_nothing"),
    "a dry run asks for credentials": (
        "transformer_jax/cli.py",
        "parse_flags",
        '  reading = not any(flags.FLAGS[name].value for name in ("dry_run", "print_config")',
        '  reading = not any(flags.FLAGS[name].value for name in ("print_config",)',
        "tests/launch/test_tpu_launch.py::test_a_bucket_without_credentials_is_refused_in_one"
        "_line_touching_nothing"),
    "a finished TPU trial is deleted with its workers' logs": (
        "launch/tpu_vm.py",
        "_finish",
        "  if trial.failures < max_failures and not _logs_saved(trial, pack, repo_dir, run_gcloud):",
        "  if False:",
        "tests/launch/test_tpu_launch.py::test_the_workers_logs_reach_the_bucket_before_the_tpu"
        "_goes_and_results_show_the_last_line"),
    "the reproductions' bfloat16 goes undocumented": (
        "experiments/base_reproduction.py",
        "trials",
        "  return sweep.named(base={})",
        '  return sweep.named(base={"model.dtype": "bfloat16"})',
        "tests/launch/test_launch.py::test_the_documented_float32_override_undoes_the_reproductions"
        "_bfloat16"),
    "a process of a run of several tokenizes the training split itself": (
        "transformer_jax/data/tokenized.py",
        "load_or_build",
        "      if not build:\n        raise NotPrepared(",
        "      if False:\n        raise NotPrepared(",
        "tests/data/test_tasks.py::test_data_not_prepared_is_named_and_never_built_where_building_is_not_allowed"),
    "a SLURM job's processes start with no data prepared before them": (
        "launch/targets/slurm.py",
        "array_script",
        "--prepare_data'\n              ] * prepare,",
        "--prepare_data'\n              ] * False,",
        "tests/launch/test_launch.py::test_slurm_dry_run_is_an_array_job_with_one_task_per_gpu"),
    "launch.results forgets results.json's test line where no log has it": (
        "launch/results.py",
        "final_line",
        "  return run_files.test_line(test)",
        "  return None",
        "tests/launch/test_launch.py::test_results_final_line_is_the_logs_last_test_line_else_"
        "results_jsons"),
    "a run made before WMT14's version was pinned is refused": (
        "transformer_jax/checkpoint.py",
        "config_changes",
        '        if f.name == "tfds_name" and a == b.split(":")[0]:',
        '        if f.name == "tfds_name" and a in b:',
        "tests/scenarios/test_bad_input.py::test_a_run_made_before_the_tfds_version_was_pinned_"
        "resumes_another_dataset_does_not"),
    "one machine's processes get the root's TFDS folder": (
        "launch/__main__.py",
        "main",
        "  if target.hosts() > 1:",
        "  if target.processes() > 1:",
        "tests/launch/test_launch.py::test_a_run_of_several_processes_reads_data_prepared_once_"
        "where_all_read_it"),
}


def scope_span(source: str, path: str, scope: str) -> tuple[int, int]:
  """Where `scope` is in `source` (offsets of its first and past its last character):
  in Python, the def, class or module-level assignment of that qualified name; elsewhere
  the heading line `scope` up to the next heading of its level or above."""
  starts = [0]
  for line in source.splitlines(keepends=True):
    starts.append(starts[-1] + len(line))
  if not path.endswith(".py"):
    lines = source.splitlines(keepends=True)
    heads = [i for i, line in enumerate(lines) if line.rstrip("\n") == scope]
    if len(heads) != 1:
      raise LookupError(f"{path} has {len(heads)} headings {scope!r}")
    level = len(scope) - len(scope.lstrip("#"))
    end = next((i for i in range(heads[0] + 1, len(lines)) if lines[i].startswith("#")
                and len(lines[i]) - len(lines[i].lstrip("#")) <= level), len(lines))
    return starts[heads[0]], starts[end]

  def walk(node, prefix):
    for child in ast.iter_child_nodes(node):
      if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        yield prefix + child.name, child
        yield from walk(child, prefix + child.name + ".")
      elif not prefix and isinstance(child, (ast.Assign, ast.AnnAssign)):
        for target in getattr(child, "targets", [getattr(child, "target", None)]):
          if isinstance(target, ast.Name):
            yield target.id, child
  found = [node for name, node in walk(ast.parse(source), "") if name == scope]
  if len(found) != 1:
    raise LookupError(f"{path} has {len(found)} definitions of {scope}")
  first = min([found[0].lineno, *(d.lineno for d in getattr(found[0], "decorator_list", []))])
  return starts[first - 1], starts[found[0].end_lineno]


def mutate(source: str, path: str, scope: str, text: str, replacement: str) -> str:
  """`source` with `text`, which must occur once inside `scope`, replaced."""
  begin, end = scope_span(source, path, scope)
  inside = source[begin:end]
  if inside.count(text) != 1:
    raise LookupError(f"{path}: {scope} has {inside.count(text)} copies of {text!r}")
  return source[:begin] + inside.replace(text, replacement) + source[end:]


def run(name: str, keep: bool) -> bool:
  """Whether the mutation's tests fail (it is caught)."""
  path, scope, text, replacement, tests = MUTATIONS[name]
  copy = tempfile.mkdtemp(prefix="mutation_")
  subprocess.run(["git", "worktree", "add", "--detach", "-q", copy, "HEAD"], cwd=ROOT,
                 check=True)
  try:
    file = os.path.join(copy, path)
    with open(file) as f:
      source = f.read()
    try:
      mutated = mutate(source, path, scope, text, replacement)
    except LookupError as e:
      raise SystemExit(f"{name}: {e}; update .ci/mutations.py") from None
    with open(file, "w") as f:
      f.write(mutated)
    start = time.time()
    out = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0",
                          "-p", "no:cacheprovider",
                          *tests.split()], cwd=copy, capture_output=True, text=True,
                         env={**os.environ, "SHARED_DATA": os.path.join(
                             ROOT, "..", "shared", "data")})
    caught = out.returncode == 1  # Tests failed; 0: all passed; else pytest could not run.
    verdict = "caught  " if caught else "SURVIVED" if out.returncode == 0 else "ERROR   "
    lines = out.stdout.strip().splitlines() or [out.stderr[-300:]]
    why = next((line[:160] for line in lines if line.startswith("E ")), "")
    print(f"{verdict} {name} ({time.time() - start:.0f} s): {lines[-1]}\n    {why}",
          flush=True)
    return caught
  finally:
    if not keep:
      subprocess.run(["git", "worktree", "remove", "--force", copy], cwd=ROOT, check=True)


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--only", default="", help="comma-separated mutation names")
  parser.add_argument("--keep", action="store_true", help="keep the mutated copies")
  args = parser.parse_args()
  names = args.only.split(",") if args.only else list(MUTATIONS)
  unknown = set(names) - set(MUTATIONS)
  if unknown:
    raise SystemExit(f"--only: unknown {sorted(unknown)}; valid: {sorted(MUTATIONS)}")
  survived = [name for name in names if not run(name, args.keep)]
  print(f"{len(names) - len(survived)} of {len(names)} caught")
  sys.exit(1 if survived else 0)


if __name__ == "__main__":
  main()
