//! AdamW with decoupled weight decay and bias correction, the learning-rate schedule (linear
//! warm-up, then cosine decay to a floor) and clipping by the global gradient norm. All
//! arithmetic is plain sequential f64 over flat vectors, so an update is bit-for-bit the same
//! for the same inputs on any machine and thread count.

/// The learning rate at optimizer step `step` (0-based): linear warm-up from lr/warmup to lr
/// over `warmup` steps, then cosine decay from lr to `lr · min_ratio` at `total`; the floor
/// afterwards.
pub fn learning_rate(lr: f64, warmup: u64, total: u64, min_ratio: f64, step: u64) -> f64 {
    if step < warmup {
        return lr * (step + 1) as f64 / warmup as f64;
    }
    let span = total.saturating_sub(warmup).max(1);
    let progress = ((step - warmup) as f64 / span as f64).min(1.0);
    let cosine = 0.5 * (1.0 + (std::f64::consts::PI * progress).cos());
    lr * (min_ratio + (1.0 - min_ratio) * cosine)
}

/// The L2 norm of all gradients together.
pub fn global_norm(grads: &[f32]) -> f64 {
    grads
        .iter()
        .map(|&g| f64::from(g) * f64::from(g))
        .sum::<f64>()
        .sqrt()
}

/// AdamW hyper-parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AdamWParams {
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    pub weight_decay: f64,
}

/// AdamW moments of every parameter, flat in the trainer's parameter order.
#[derive(Debug, Clone, PartialEq)]
pub struct AdamW {
    pub m: Vec<f64>,
    pub v: Vec<f64>,
}

impl AdamW {
    pub fn new(n: usize) -> Self {
        Self {
            m: vec![0.0; n],
            v: vec![0.0; n],
        }
    }

    /// One update of `params` (a slice of the flat parameters starting at `offset`) with
    /// `grads` (same slice), at 1-based step `t` and learning rate `lr`:
    /// `p ← p − lr·(m̂/(√v̂ + eps) + wd·p)`.
    pub fn update(
        &mut self,
        offset: usize,
        params: &mut [f64],
        grads: &[f64],
        t: u64,
        lr: f64,
        h: &AdamWParams,
    ) {
        let bc1 = 1.0 - h.beta1.powf(t as f64);
        let bc2 = 1.0 - h.beta2.powf(t as f64);
        for (i, (p, &g)) in params.iter_mut().zip(grads).enumerate() {
            let m = &mut self.m[offset + i];
            let v = &mut self.v[offset + i];
            *m = h.beta1 * *m + (1.0 - h.beta1) * g;
            *v = h.beta2 * *v + (1.0 - h.beta2) * g * g;
            let m_hat = *m / bc1;
            let v_hat = *v / bc2;
            *p -= lr * (m_hat / (v_hat.sqrt() + h.eps) + h.weight_decay * *p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedule_warms_up_then_decays_to_the_floor() {
        let lr = |s| learning_rate(1.0, 4, 14, 0.1, s);
        assert_eq!(lr(0), 0.25);
        assert_eq!(lr(3), 1.0);
        assert!((lr(4) - 1.0).abs() < 1e-12);
        assert!((lr(9) - 0.55).abs() < 1e-12);
        assert!((lr(14) - 0.1).abs() < 1e-12);
        assert!((lr(100) - 0.1).abs() < 1e-12);
        assert_eq!(learning_rate(2.0, 0, 10, 0.0, 0), 2.0);
    }

    #[test]
    fn adamw_first_step_moves_by_lr_times_sign() {
        // With bias correction the first step is lr · g/|g| (eps aside), plus decoupled decay.
        let h = AdamWParams {
            beta1: 0.9,
            beta2: 0.999,
            eps: 1e-8,
            weight_decay: 0.1,
        };
        let mut opt = AdamW::new(2);
        let mut p = vec![1.0, -2.0];
        opt.update(0, &mut p, &[0.5, -3.0], 1, 0.01, &h);
        assert!((p[0] - (1.0 - 0.01 * (1.0 + 0.1))).abs() < 1e-7, "{p:?}");
        assert!((p[1] - (-2.0 + 0.01 * (1.0 + 0.2))).abs() < 1e-7, "{p:?}");
        assert!((global_norm(&[3.0, 4.0]) - 5.0).abs() < 1e-12);
    }
}
