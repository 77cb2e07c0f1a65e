//! The worked examples and pinned behaviour of scheduler-and-prep §4 and §10 (items 36-49).

use super::*;

fn ctl(config: ControllerConfig) -> AdaptiveController {
    AdaptiveController::new(config).expect("valid config")
}

/// Explicit target, every call a PI step: the setup of the §4.3 worked example.
fn explicit(target: f64) -> ControllerConfig {
    ControllerConfig {
        target_p50_ms: Some(target),
        update_interval: 1,
        ..ControllerConfig::default()
    }
}

fn window_of(
    capacity: usize,
    min: usize,
    values: impl IntoIterator<Item = f64>,
) -> PercentileWindow {
    let mut w = PercentileWindow::new(capacity, min).unwrap();
    for v in values {
        w.push(v);
    }
    w
}

// ------------------------------------------------------------------------------ §4.1 windows

#[test]
fn percentile_examples() {
    let w = window_of(200, 10, (1..=10).map(f64::from));
    assert_eq!(w.p50(), Some(5.0));
    let w = window_of(5, 1, (1..=10).map(f64::from));
    assert_eq!(w.values().collect::<Vec<_>>(), [6.0, 7.0, 8.0, 9.0, 10.0]);
    assert_eq!(w.p50(), Some(8.0));
    assert_eq!(w.percentile(0.0).unwrap(), Some(6.0));
    assert_eq!(w.percentile(100.0).unwrap(), Some(10.0));
    assert_eq!(w.percentile(99.0).unwrap(), Some(9.0)); // floor(0.99 × 4) = 3
}

#[test]
fn percentile_needs_min_samples() {
    let w = window_of(200, 10, (1..=9).map(f64::from));
    assert_eq!(w.p50(), None);
    assert!(w.percentile(101.0).is_err());
    assert!(w.percentile(f64::NAN).is_err());
    assert!(PercentileWindow::new(0, 0).is_err());
    let empty = PercentileWindow::new(3, 0).unwrap();
    assert_eq!(empty.p50(), None);
    assert_eq!(empty.mean(), None);
}

#[test]
fn window_drops_nan_and_takes_the_mean() {
    let mut w = PercentileWindow::new(EFFICIENCY_WINDOW, 1).unwrap();
    assert!(!w.push(f64::NAN));
    assert!(w.is_empty());
    for v in [0.5, 1.0, 0.75] {
        assert!(w.push(v));
    }
    assert_eq!(w.mean(), Some(0.75));
    for _ in 0..EFFICIENCY_WINDOW {
        w.push(0.25);
    }
    assert_eq!(w.len(), EFFICIENCY_WINDOW);
    assert_eq!(w.mean(), Some(0.25));
    w.clear();
    assert_eq!(w.mean(), None);
}

// --------------------------------------------------------------------------- §4.2 parameters

#[test]
fn module_defaults_are_pinned() {
    let c = ControllerConfig::default();
    assert_eq!(c.target_p50_ms, None);
    assert_eq!(
        (
            c.calibration_multiplier,
            c.min_target_p50_ms,
            c.max_target_p50_ms
        ),
        (1.5, 5.0, 500.0)
    );
    assert_eq!(
        (c.min_wait_ms, c.max_wait_ms, c.initial_wait_ms),
        (1.0, 50.0, 10.0)
    );
    assert_eq!(
        (c.min_batch_cost, c.max_batch_cost, c.initial_batch_cost),
        (256, 65536, 16384)
    );
    assert_eq!((c.gain, c.integral_gain, c.cost_gain), (0.3, 0.05, 0.15));
    assert_eq!(
        (c.update_interval, c.fill_ratio_threshold, c.integral_max),
        (10, 0.7, 20.0)
    );
    assert!(c.starvation_recovery_enabled);
    assert_eq!((c.starvation_window, c.starvation_batch_size), (20, 1));
    let a = ctl(c);
    assert!(!a.calibrated());
    assert_eq!((a.current_wait_ms(), a.current_batch_cost()), (10.0, 16384));
}

#[test]
fn production_cost_range_table() {
    for (b, floor, ceil, init) in [
        (16384, 4096, 65536, 16384),
        (8192, 2048, 32768, 8192),
        (1024, 256, 4096, 1024),
        (512, 256, 2048, 512),
        (128, 128, 512, 128),
        (720000, 180000, 2880000, 720000),
    ] {
        assert_eq!(production_cost_range(b), (floor, ceil, init), "B = {b}");
        let c = ControllerConfig::production(b, 15.0);
        assert_eq!(
            (c.min_batch_cost, c.max_batch_cost, c.initial_batch_cost),
            (floor, ceil, init)
        );
    }
    // Degenerate budgets stay well-formed: B = 0 gives [1, 1], a huge B saturates.
    assert_eq!(production_cost_range(0), (1, 1, 1));
    assert_eq!(production_cost_range(u64::MAX).1, u64::MAX);
}

#[test]
fn production_derivation() {
    let c = ControllerConfig::production(16384, 25.0);
    assert_eq!(c.min_wait_ms, 15.0);
    assert_eq!(c.max_wait_ms, 50.0);
    assert_eq!(c.cost_gain, c.gain * 0.5);
    assert_eq!(c.cost_gain, 0.15);
    assert_eq!(c.target_p50_ms, None);
    assert_eq!(ctl(c).current_wait_ms(), 25.0);
}

fn with_env(pairs: &[(&str, &str)]) -> (ControllerConfig, Vec<String>) {
    let mut c = ControllerConfig::production(16384, 15.0);
    let warnings = c.apply_env(|name| {
        pairs
            .iter()
            .find(|(k, _)| *k == name)
            .map(|(_, v)| (*v).to_owned())
    });
    (c, warnings)
}

#[test]
fn env_overrides() {
    let (c, w) = with_env(&[
        (ENV_MIN_WAIT_MS, "garbage"),
        (ENV_MAX_WAIT_MS, "NaN"),
        (ENV_CALIBRATION_MULT, "inf"),
        (ENV_MIN_COST, "-1"),
        (ENV_MAX_COST, "16k"),
        (ENV_INITIAL_COST, ""),
    ]);
    assert_eq!(c, ControllerConfig::production(16384, 15.0));
    assert_eq!(w.len(), 6);

    let (c, _) = with_env(&[(ENV_MAX_WAIT_MS, "10")]);
    assert_eq!((c.min_wait_ms, c.max_wait_ms), (10.0, 10.0)); // min > max reconciled to max
    assert_eq!(ctl(c).current_wait_ms(), 10.0);

    let (c, _) = with_env(&[(ENV_MAX_WAIT_MS, "5")]);
    assert!(ctl(c).current_wait_ms() <= 5.0);

    let (c, _) = with_env(&[(ENV_TARGET_P50_MS, " 42.5 ")]);
    let a = ctl(c);
    assert_eq!(a.target_p50_ms(), Some(42.5));
    assert!(a.calibrated()); // an explicit target disables auto-calibration

    let (c, w) = with_env(&[(ENV_MIN_WAIT_MS, "5")]);
    assert!(w.is_empty());
    assert_eq!(c.min_wait_ms, 5.0);

    let (c, _) = with_env(&[(ENV_MIN_COST, "100000"), (ENV_MAX_COST, "1000")]);
    assert_eq!((c.min_batch_cost, c.max_batch_cost), (1000, 1000));
    assert_eq!(ctl(c).current_batch_cost(), 1000);

    let (c, _) = with_env(&[(ENV_MIN_TARGET_P50_MS, "600")]);
    assert_eq!(c.min_target_p50_ms, 500.0);
    let (c, _) = with_env(&[(ENV_INITIAL_WAIT_MS, "1e1"), (ENV_INITIAL_COST, "20000")]);
    let a = ctl(c);
    assert_eq!((a.current_wait_ms(), a.current_batch_cost()), (15.0, 20000));
}

#[test]
fn invalid_configs_are_rejected() {
    let bad = [
        ControllerConfig {
            min_wait_ms: 60.0,
            ..Default::default()
        },
        ControllerConfig {
            min_batch_cost: 70000,
            ..Default::default()
        },
        ControllerConfig {
            target_p50_ms: Some(0.0),
            ..Default::default()
        },
        ControllerConfig {
            gain: f64::NAN,
            ..Default::default()
        },
        ControllerConfig {
            gain: 2.0,
            ..Default::default()
        },
        ControllerConfig {
            update_interval: 0,
            ..Default::default()
        },
        ControllerConfig {
            starvation_window: 0,
            ..Default::default()
        },
        ControllerConfig {
            max_target_p50_ms: 1.0,
            ..Default::default()
        },
    ];
    for c in bad {
        assert!(AdaptiveController::new(c.clone()).is_err(), "{c:?}");
    }
}

// --------------------------------------------------------------------------- §4.3 the step law

#[test]
fn worked_example() {
    let mut a = ctl(ControllerConfig {
        initial_wait_ms: 15.0,
        ..explicit(50.0)
    });
    assert_eq!(a.step(Some(10.0), Some(0.9), Some(8), 0.0), (27.0, 18350));
    assert_eq!(a.integral(), 0.0); // dt = 0 on the first PI step
}

#[test]
fn calibration_from_the_inference_window() {
    let mut a = ctl(ControllerConfig {
        calibration_multiplier: 2.0,
        ..ControllerConfig::default()
    });
    for _ in 0..20 {
        a.record_inference(10.0);
    }
    for i in 0..9 {
        assert_eq!(
            a.step(Some(1.0), Some(1.0), Some(8), f64::from(i)),
            (10.0, 16384)
        );
        assert!(!a.calibrated());
    }
    assert_eq!(a.step(Some(1.0), Some(1.0), Some(8), 9.0), (10.0, 16384)); // held on calibration
    assert!(a.calibrated());
    assert_eq!(a.target_p50_ms(), Some(20.0));
    a.record_inference(1000.0); // ignored once calibrated
    assert_eq!(a.target_p50_ms(), Some(20.0));

    let mut a = ctl(ControllerConfig {
        calibration_multiplier: 100.0,
        max_target_p50_ms: 50.0,
        update_interval: 1,
        ..ControllerConfig::default()
    });
    for _ in 0..10 {
        a.record_inference(5.0);
    }
    a.step(None, None, None, 0.0);
    assert_eq!(a.target_p50_ms(), Some(50.0));
}

#[test]
fn calibration_needs_ten_samples_and_uses_the_last_fifty() {
    let mut a = ctl(ControllerConfig {
        update_interval: 1,
        ..ControllerConfig::default()
    });
    for _ in 0..9 {
        a.record_inference(10.0);
    }
    a.step(Some(1.0), None, None, 0.0);
    assert!(!a.calibrated());
    for _ in 0..50 {
        a.record_inference(100.0);
    }
    a.step(Some(1.0), None, None, 0.0);
    assert_eq!(a.target_p50_ms(), Some(150.0)); // the 9 early samples were evicted
}

#[test]
fn knobs_held_before_calibration() {
    let mut a = ctl(ControllerConfig {
        update_interval: 1,
        ..ControllerConfig::default()
    });
    for i in 0..100 {
        let obs = if i % 2 == 0 { 1e9 } else { 0.0 };
        assert_eq!(
            a.step(Some(obs), Some(1.0), Some(1), f64::from(i)),
            (10.0, 16384)
        );
    }
    assert_eq!(a.starvation_resets(), 0);
}

#[test]
fn headroom_moves_the_wait_and_saturates() {
    let mut a = ctl(explicit(50.0));
    let (w1, _) = a.step(Some(10.0), None, None, 0.0);
    assert!(w1 > 10.0);
    for i in 1..200 {
        a.step(Some(10.0), None, None, f64::from(i));
    }
    assert_eq!(a.current_wait_ms(), 50.0);
    let mut b = ctl(explicit(50.0));
    let (w2, _) = b.step(Some(90.0), None, None, 0.0);
    assert!(w2 < 10.0);
    for i in 1..200 {
        b.step(Some(90.0), None, None, f64::from(i));
    }
    assert_eq!(b.current_wait_ms(), 1.0);
}

#[test]
fn cost_moves_only_when_saturated() {
    let mut a = ctl(explicit(50.0));
    assert_eq!(a.step(Some(10.0), Some(0.69), None, 0.0).1, 16384);
    assert_eq!(a.step(Some(10.0), None, None, 0.0).1, 16384);
    assert!(a.step(Some(10.0), Some(0.7), None, 0.0).1 > 16384);
    for i in 0..200 {
        a.step(Some(10.0), Some(1.0), None, f64::from(i));
    }
    assert_eq!(a.current_batch_cost(), 65536);
    for i in 200..600 {
        a.step(Some(200.0), Some(1.0), None, f64::from(i));
    }
    assert_eq!(a.current_batch_cost(), 256);
}

#[test]
fn update_interval_gates_the_law() {
    let mut a = ctl(ControllerConfig {
        update_interval: 5,
        ..explicit(50.0)
    });
    for i in 0..4 {
        assert_eq!(
            a.step(Some(10.0), Some(1.0), None, f64::from(i)),
            (10.0, 16384)
        );
    }
    let (w, c) = a.step(Some(10.0), Some(1.0), None, 4.0);
    assert!(w > 10.0 && c > 16384);
    for i in 5..9 {
        assert_eq!(a.step(Some(10.0), Some(1.0), None, f64::from(i)), (w, c));
    }
}

#[test]
fn anti_windup_at_max_wait() {
    let mut a = ctl(explicit(50.0));
    for i in 0..40 {
        a.step(Some(10.0), None, None, f64::from(i) * 0.1);
    }
    assert_eq!(a.current_wait_ms(), 50.0);
    let frozen = a.integral();
    for i in 40..80 {
        a.step(Some(10.0), None, None, f64::from(i) * 0.1);
        assert_eq!(a.integral(), frozen);
    }
    // Negative headroom while at max integrates again.
    a.step(Some(60.0), None, None, 8.1);
    assert!(a.integral() < frozen);
}

#[test]
fn integral_is_clamped() {
    let mut a = ctl(ControllerConfig {
        max_wait_ms: 1e6,
        ..explicit(50.0)
    });
    for i in 0..100 {
        a.step(Some(0.0), None, None, f64::from(i));
    }
    assert_eq!(a.integral(), 20.0);
}

#[test]
fn idle_decay() {
    let mut a = ctl(ControllerConfig {
        initial_wait_ms: 20.0,
        ..explicit(50.0)
    });
    a.step(Some(49.0), None, None, 0.0);
    a.step(Some(49.0), None, None, 1.0); // integral = 1 × 1 s
    assert_eq!(a.integral(), 1.0);
    a.step(Some(50.0), None, None, 6.0); // 5 s gap: × 0.5^3, then + 0 × 5
    assert_eq!(a.integral(), 0.125);
    a.step(Some(50.0), None, None, 100.0); // dt capped at 5: × 0.5^3 again
    assert_eq!(a.integral(), 0.015625);
    a.step(Some(50.0), None, None, 50.0); // a clock that runs backwards counts as dt 0
    assert_eq!(a.integral(), 0.015625);
}

#[test]
fn nan_and_infinite_signals_count_as_absent() {
    let mut a = ctl(explicit(50.0));
    assert_eq!(a.step(Some(f64::NAN), Some(1.0), None, 0.0), (10.0, 16384));
    assert_eq!(
        a.step(Some(f64::INFINITY), Some(1.0), None, 0.0),
        (10.0, 16384)
    );
    let (w, c) = a.step(Some(10.0), Some(f64::NAN), None, 0.0);
    assert!(w > 10.0);
    assert_eq!(c, 16384);
    a.step(Some(10.0), Some(1.0), None, f64::NAN);
    assert!(a.integral().is_finite());
}

// ------------------------------------------------------------------------------ §4.4 starvation

fn starvation_config() -> ControllerConfig {
    ControllerConfig {
        min_wait_ms: 1.0,
        initial_wait_ms: 20.0,
        min_batch_cost: 100,
        initial_batch_cost: 4000,
        starvation_window: 5,
        ..explicit(10.0)
    }
}

/// Drive both knobs to their floors with large batches (no streak).
fn at_floors(config: ControllerConfig) -> AdaptiveController {
    let mut a = ctl(config);
    for i in 0..200 {
        a.step(Some(1000.0), Some(1.0), Some(64), f64::from(i));
    }
    assert_eq!(a.current_wait_ms(), a.config().min_wait_ms);
    assert_eq!(a.current_batch_cost(), a.config().min_batch_cost);
    assert_eq!(a.starvation_streak(), 0);
    a
}

#[test]
fn starvation_example() {
    let mut a = at_floors(starvation_config());
    for i in 0..4 {
        a.step(Some(1000.0), Some(1.0), Some(1), 300.0 + f64::from(i));
        assert_eq!(a.starvation_resets(), 0);
    }
    assert_eq!(a.starvation_streak(), 4);
    assert_eq!(
        a.step(Some(1000.0), Some(1.0), Some(1), 305.0),
        (10.5, 2000)
    );
    assert_eq!(a.starvation_resets(), 1);
    assert_eq!(a.starvation_streak(), 0);
    assert_eq!(a.integral(), 0.0);
    // The next step is a first PI step again (dt = 0, so nothing integrates).
    a.step(Some(5.0), None, None, 1e6);
    assert_eq!(a.integral(), 0.0);
}

#[test]
fn starvation_with_production_defaults() {
    let c = ControllerConfig {
        target_p50_ms: Some(10.0),
        update_interval: 1,
        ..ControllerConfig::production(16384, 15.0)
    };
    let mut a = at_floors(c);
    let mut last = (0.0, 0);
    for i in 0..20 {
        last = a.step(Some(1000.0), Some(1.0), Some(1), 300.0 + f64::from(i));
    }
    assert_eq!(last, (15.0, 16384));
    assert_eq!(a.starvation_resets(), 1);
}

#[test]
fn starvation_streak_rules() {
    // A healthy batch resets the streak; None leaves it; size 1 counts even off the floors [R].
    let mut a = ctl(starvation_config());
    a.step(Some(10.0), None, Some(1), 0.0);
    a.step(Some(10.0), None, Some(1), 0.0);
    assert_eq!(a.starvation_streak(), 2);
    a.step(Some(10.0), None, None, 0.0);
    assert_eq!(a.starvation_streak(), 2);
    a.step(Some(10.0), None, Some(2), 0.0);
    assert_eq!(a.starvation_streak(), 0);
    a.step(Some(10.0), None, Some(0), 0.0);
    assert_eq!(a.starvation_streak(), 1);
    // Gated calls count too.
    let mut g = ctl(ControllerConfig {
        update_interval: 10,
        ..starvation_config()
    });
    g.step(None, None, Some(1), 0.0);
    assert_eq!(g.starvation_streak(), 1);
}

#[test]
fn starvation_disabled_or_off_floor_never_recovers() {
    let mut a = at_floors(ControllerConfig {
        starvation_recovery_enabled: false,
        ..starvation_config()
    });
    for i in 0..50 {
        a.step(Some(1000.0), Some(1.0), Some(1), 300.0 + f64::from(i));
    }
    assert_eq!(a.starvation_resets(), 0);
    // Off-floor equilibrium: observed = target keeps the knobs where they are.
    let mut b = ctl(starvation_config());
    for i in 0..50 {
        b.step(Some(10.0), Some(1.0), Some(1), f64::from(i));
    }
    assert_eq!(b.starvation_resets(), 0);
    assert_eq!(b.starvation_streak(), 50);
}

// ------------------------------------------------------------------------- §4.5 reset, snapshot

#[test]
fn reset_restores_and_keeps_the_right_things() {
    let mut a = at_floors(starvation_config());
    for i in 0..5 {
        a.step(Some(1000.0), Some(1.0), Some(1), 300.0 + f64::from(i));
    }
    assert_eq!(a.starvation_resets(), 1);
    a.step(Some(1000.0), Some(1.0), Some(1), 400.0);
    a.reset();
    assert_eq!((a.current_wait_ms(), a.current_batch_cost()), (20.0, 4000));
    assert_eq!(a.target_p50_ms(), Some(10.0)); // explicit target kept
    assert!(a.calibrated());
    assert_eq!(a.starvation_resets(), 1);
    assert_eq!(a.starvation_streak(), 0);
    assert_eq!(a.integral(), 0.0);

    let mut auto = ctl(ControllerConfig {
        update_interval: 1,
        ..ControllerConfig::default()
    });
    for _ in 0..10 {
        auto.record_inference(10.0);
    }
    auto.step(None, None, None, 0.0);
    assert_eq!(auto.target_p50_ms(), Some(15.0));
    auto.reset();
    assert!(!auto.calibrated());
    assert_eq!(auto.target_p50_ms(), None);
    auto.step(None, None, None, 0.0);
    assert!(!auto.calibrated()); // the inference window was cleared too
}

#[test]
fn reset_restarts_the_update_interval() {
    let mut a = ctl(ControllerConfig {
        update_interval: 3,
        ..explicit(50.0)
    });
    a.step(Some(10.0), None, None, 0.0);
    a.step(Some(10.0), None, None, 0.0);
    a.reset();
    assert_eq!(a.step(Some(10.0), None, None, 0.0).0, 10.0);
    assert_eq!(a.step(Some(10.0), None, None, 0.0).0, 10.0);
    assert!(a.step(Some(10.0), None, None, 0.0).0 > 10.0);
}

#[test]
fn snapshot_fields() {
    let mut a = ctl(explicit(50.0));
    let s = a.snapshot();
    assert_eq!(s.headroom_ms, None);
    assert!(s.enabled && s.calibrated);
    a.step(Some(30.0), Some(0.5), Some(3), 0.0);
    let s = a.snapshot();
    assert_eq!(s.observed_p50_ms, Some(30.0));
    assert_eq!(s.headroom_ms, Some(20.0));
    assert_eq!(s.fill_ratio, Some(0.5));
    assert_eq!(s.current_wait_ms, a.current_wait_ms());
    assert_eq!(s.starvation_streak, 0);
    assert_eq!(
        ctl(ControllerConfig::default()).snapshot().target_p50_ms,
        None
    );
}

// ------------------------------------------------------------------------------ invariants

/// xorshift64*: deterministic pseudo-random traces without a dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

#[test]
fn random_traces_stay_in_bounds() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    for case in 0..200 {
        let c = ControllerConfig {
            update_interval: 1 + rng.next() % 4,
            starvation_window: 1 + rng.next() % 6,
            min_batch_cost: rng.next() % 1000,
            initial_batch_cost: rng.next() % 100_000,
            ..ControllerConfig::default()
        };
        let mut a = ctl(c.clone());
        let mut now = 0.0;
        for _ in 0..300 {
            match rng.next() % 4 {
                0 => a.record_inference(rng.unit() * 200.0),
                _ => {
                    now += rng.unit() * 8.0;
                    let obs = (!rng.next().is_multiple_of(5)).then(|| rng.unit() * 600.0);
                    let fill = (!rng.next().is_multiple_of(3)).then(|| rng.unit() * 1.2);
                    let size = (!rng.next().is_multiple_of(4)).then(|| rng.next() % 3);
                    let (w, cost) = a.step(obs, fill, size, now);
                    assert!((c.min_wait_ms..=c.max_wait_ms).contains(&w), "case {case}");
                    assert!(
                        (c.min_batch_cost..=c.max_batch_cost).contains(&cost),
                        "case {case}"
                    );
                    assert!(a.integral().abs() <= c.integral_max);
                }
            }
        }
    }
}

#[test]
fn converges_on_a_linear_plant() {
    // latency = 4 ms + cost / 1000 ms, always saturated: the cost settles where p50 = target.
    let mut a = ctl(explicit(30.0));
    let mut p50 = 0.0;
    for i in 0..400 {
        p50 = 4.0 + a.current_batch_cost() as f64 / 1000.0;
        a.step(Some(p50), Some(1.0), Some(32), f64::from(i) * 0.05);
    }
    assert!((p50 - 30.0).abs() < 0.3, "p50 {p50}");
}

// ---------------------------------------------------------------------------------- replay

#[test]
fn replay_worked_example_and_clock() {
    let cfg = r#"{"target_p50_ms": 50, "update_interval": 1, "initial_wait_ms": 15}"#;
    let trace = [
        "# comment",
        "",
        "   ",
        r#"{"event":"step","dt_s":0.0,"observed_p50_ms":10,"fill_ratio":0.9,"batch_size":8,"x":[1,{"y":null}]}"#,
    ];
    let out = replay(Some(cfg), trace).unwrap();
    assert_eq!(out, vec![(27.0, 18350, 0)]);
}

#[test]
fn replay_clock_advances_on_gated_steps() {
    // update_interval 2: the gated call's dt_s still advances the clock, so the second PI step
    // sees dt = 1 + 1 = 2 s (integral 40 × 2 = 80 → clamped 20).
    let cfg = r#"{"target_p50_ms": 50, "update_interval": 2, "max_wait_ms": 1000}"#;
    let step = |dt: f64| format!(r#"{{"event":"step","dt_s":{dt},"observed_p50_ms":10}}"#);
    let lines = [step(0.0), step(0.0), step(1.0), step(1.0)];
    let out = replay(Some(cfg), lines.iter().map(String::as_str)).unwrap();
    assert_eq!(out[1].0, 10.0 + 12.0);
    assert_eq!(out[3].0, 22.0 + 12.0 + 20.0 * 0.05);
}

#[test]
fn replay_is_deterministic_and_counts_resets() {
    let cfg = r#"{"target_p50_ms": 10, "update_interval": 1, "min_wait_ms": 1, "initial_wait_ms": 20,
                 "min_batch_cost": 100, "initial_batch_cost": 4000, "starvation_window": 5}"#;
    let mut lines: Vec<String> = (0..200)
        .map(|_| {
            r#"{"event":"step","dt_s":1,"observed_p50_ms":1000,"fill_ratio":1,"batch_size":64}"#
                .into()
        })
        .collect();
    lines.extend((0..5).map(|_| {
        r#"{"event":"step","dt_s":1,"observed_p50_ms":1000,"fill_ratio":1,"batch_size":1}"#
            .to_owned()
    }));
    let a = replay(Some(cfg), lines.iter().map(String::as_str)).unwrap();
    let b = replay(Some(cfg), lines.iter().map(String::as_str)).unwrap();
    assert_eq!(a, b);
    assert_eq!(a.last(), Some(&(10.5, 2000, 1)));
}

#[test]
fn replay_errors() {
    let err = replay(None, [r#"{"event":"step"}"#]).unwrap_err();
    assert_eq!(err.line, Some(1));
    assert!(err.message.contains("dt_s"), "{err}");
    let err = replay(None, ["", r#"{"event":"nap","dt_s":1}"#]).unwrap_err();
    assert_eq!(err.to_string(), "line 2: unknown event kind \"nap\"");
    for bad in [
        r#"{"event":"step","dt_s":null}"#,
        r#"{"event":"step","dt_s":"1"}"#,
        r#"{"event":"step","dt_s":1,"batch_size":1.5}"#,
        r#"{"event":"step","dt_s":1,"batch_size":-1}"#,
        r#"{"event":"step","dt_s":1,"batch_size":true}"#,
        r#"{"event":"step","dt_s":1,"batch_size":18446744073709551616}"#,
        r#"{"event":"record_inference"}"#,
        r#"{"dt_s":1}"#,
        r#"{"event":1}"#,
        r#"["step"]"#,
        r#"{"event":"step","dt_s":1} x"#,
        r#"{"event":"step","dt_s":01}"#,
        r#"{"event":"step","dt_s":NaN}"#,
        r#"{"event":"step","dt_s":1,}"#,
    ] {
        assert!(replay(None, [bad]).is_err(), "{bad}");
    }
    assert!(replay(Some(r#"{"gian": 0.3}"#), [""])
        .unwrap_err()
        .line
        .is_none());
    assert!(replay(Some(r#"{"gain": 3}"#), [""]).is_err());
    assert!(replay(Some("[]"), [""]).is_err());
}

#[test]
fn replay_json_details() {
    // Escapes, duplicates (last wins), -0 as an integer, exponents and null target.
    let cfg = r#"{"target_p50_ms": null, "gain": "x", "gain": 0.3, "update_\u0069nterval": 1}"#;
    let lines = [
        r#"{"ev\u0065nt":"record_inference","inference_ms":1e1}"#,
        r#"{"event":"nap","event":"step","dt_s":-0,"batch_size":-0}"#,
    ];
    let out = replay(Some(cfg), lines).unwrap();
    assert_eq!(out, vec![(10.0, 16384, 0)]);
    let deep = format!(
        "{}{}",
        "[".repeat(json::MAX_DEPTH + 1),
        "]".repeat(json::MAX_DEPTH + 1)
    );
    assert!(json::parse(&deep).is_err());
    let ok = format!(
        "{}{}",
        "[".repeat(json::MAX_DEPTH),
        "]".repeat(json::MAX_DEPTH)
    );
    assert!(json::parse(&ok).is_ok());
    assert_eq!(
        json::parse(r#""\ud83d\ude00\ud800x\n""#).unwrap(),
        json::Value::String("\u{1F600}\u{FFFD}x\n".into())
    );
    assert!(json::parse("\"a\u{1}\"").is_err());
    assert!(json::parse(r#""\x""#).is_err());
    assert_eq!(
        json::Value::Number("1e400".into(), false).f64("v"),
        Ok(f64::INFINITY)
    );
}
